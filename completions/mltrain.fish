# mltrain fish completion.
# Install: mltrain completions fish > ~/.config/fish/completions/mltrain.fish
# or load it in a running shell: mltrain completions fish | source

# The words before any '--' that are neither options nor option values: the subcommand first,
# then its positionals.
function __mltrain_words
    set -l with_value --color -n --nprocs --procs-per-host --hostfile -H --hosts --include --exclude -e --env -x \
        --master-port --max-restarts --timeout --grace-period --profile --name --workdir --ranks -r --rank -g --grep -t --tail
    set -l skip 0
    for tok in (commandline -opc)[2..-1]
        if test $skip -eq 1
            set skip 0
            continue
        end
        switch $tok
            case --
                return
            case '-*=*'
                continue
            case '-*'
                contains -- $tok $with_value; and set skip 1
                continue
        end
        echo $tok
    end
end

# True once a '--' is on the command line: what follows is the command to run.
function __mltrain_after_dashdash
    contains -- -- (commandline -opc)
end

# True when no subcommand has been given yet.
function __mltrain_no_subcommand
    test (count (__mltrain_words)) -eq 0
    and not __mltrain_after_dashdash
end

# True when the subcommand is one of the arguments, and no '--' has been given.
function __mltrain_using
    set -l words (__mltrain_words)
    set -q words[1]; and contains -- $words[1] $argv; and not __mltrain_after_dashdash
end

# True while the subcommand has no positional argument yet.
function __mltrain_no_positional
    set -l words (__mltrain_words)
    test (count $words) -le 1
end

# Run ids: the folders in the runs directory (the same place mltrain itself looks), plus "latest".
function __mltrain_run_ids
    set -l home $MLTRAIN_HOME
    if test -z "$home"
        if test -n "$XDG_STATE_HOME"
            set home $XDG_STATE_HOME/mltrain
        else
            set home $HOME/.local/state/mltrain
        end
    end
    for d in $home/runs/*/
        basename -- $d
    end
    echo latest
end

# *.toml files, and directories to walk into.
function __mltrain_toml_files
    complete -C "__fish_command_without_completions "(commandline -ct) | string match -r -- '^.*(?:\.toml|/)$'
end

# Profiles: the built-in names, the user's profiles (by name), and .toml paths once a path is typed.
function __mltrain_profiles
    printf '%s\tbuilt-in profile\n' local nccl-ethernet cpu-cluster
    set -l config $XDG_CONFIG_HOME
    test -n "$config"; or set config $HOME/.config
    for p in $config/mltrain/profiles/*.toml
        printf '%s\tuser profile\n' (basename -- $p .toml)
    end
    set -l cur (commandline -ct)
    if string match -q -r -- '[/.~]' $cur
        __mltrain_toml_files
    end
end

# After '--': complete the command to run and its arguments with that command's own completions.
function __mltrain_complete_command
    set -l tokens (commandline -opc)
    set -l i (contains -i -- -- $tokens)
    set -l rest $tokens[(math $i + 1)..-1]
    __fish_complete_subcommand --commandline $rest (commandline -ct)
end

complete -c mltrain -f

# Subcommands.
complete -c mltrain -n __mltrain_no_subcommand -a run -d "Start a job's ranks, stream their output, stop them together"
complete -c mltrain -n __mltrain_no_subcommand -a validate -d "Check a job spec and its hosts without starting anything"
complete -c mltrain -n __mltrain_no_subcommand -a logs -d "Print a run's logs (the latest run by default)"
complete -c mltrain -n __mltrain_no_subcommand -a ls -d "List recorded runs, newest first"
complete -c mltrain -n __mltrain_no_subcommand -a show -d "Show one run: command, hosts, ranks and how each ended"
complete -c mltrain -n __mltrain_no_subcommand -a stop -d "Stop a running job"
complete -c mltrain -n __mltrain_no_subcommand -a rm -d "Remove the records of ended runs"
complete -c mltrain -n __mltrain_no_subcommand -a gc -d "Remove old run records"
complete -c mltrain -n __mltrain_no_subcommand -a completions -d "Print the shell completion script for bash, zsh or fish"
complete -c mltrain -n __mltrain_no_subcommand -a knobs -d "List the environment variables mltrain reads, with defaults"
complete -c mltrain -n __mltrain_no_subcommand -a doctor -d "Check every host of a job: connection, agent, ports, GPUs, Python"
complete -c mltrain -n __mltrain_no_subcommand -a bench -d "Measure the collectives of the comm library between the ranks of a job"
complete -c mltrain -n __mltrain_no_subcommand -a top -d "Live CPU, GPU and time in collectives of a run or of hosts"
complete -c mltrain -n __mltrain_no_subcommand -a exec -d "Run one command on every host of a job"
complete -c mltrain -n __mltrain_no_subcommand -a ssh -d "A shell where a rank of a run runs"
complete -c mltrain -n __mltrain_no_subcommand -a cp -d "Copy a file or folder from the host of a run to this machine"
complete -c mltrain -n __mltrain_no_subcommand -a export -d "Print a job as a Kubernetes Volcano Job or PyTorchJob"
complete -c mltrain -n __mltrain_no_subcommand -a sbatch -d "Submit a job to Slurm"
complete -c mltrain -n __mltrain_no_subcommand -a queue -d "Who holds which GPUs on the hosts, and which jobs wait for them"
complete -c mltrain -n __mltrain_no_subcommand -a rerun -d "Run a recorded run again: the same code, spec and hosts"
complete -c mltrain -n __mltrain_no_subcommand -a diff -d "What changed between two runs: record, metrics, spec and code"
complete -c mltrain -n __mltrain_no_subcommand -a sweep -d "Run a job once per trial of its [sweep] parameters and rank them"
complete -c mltrain -n '__mltrain_using sweep' -l resume -x -d 'Go on with a sweep: the trials not finished'
complete -c mltrain -n '__mltrain_using sweep' -l max-parallel -x -d 'Trials at once'
complete -c mltrain -n '__mltrain_using sweep; and __mltrain_no_positional' -k -a '(__mltrain_toml_files)' -d 'Job spec with [sweep]'

# Global options (mltrain also takes them after the subcommand).
complete -c mltrain -n 'not __mltrain_after_dashdash' -s h -l help -d 'Print help and exit'
complete -c mltrain -n __mltrain_no_subcommand -l version -d 'Print the version and exit'
complete -c mltrain -n 'not __mltrain_after_dashdash' -s v -l verbose -d 'More diagnostics on stderr (repeat for debug)'
complete -c mltrain -n 'not __mltrain_after_dashdash' -l color -x -a 'auto always never' -d 'Colour rank prefixes'

# run and validate (and rerun, whose spec is recorded: a run id instead of the job spec).
complete -c mltrain -n "__mltrain_using run validate; and __mltrain_no_positional" -k -a '(__mltrain_toml_files)' -d 'Job spec'
set -l job 'run validate rerun'
complete -c mltrain -n "__mltrain_using $job" -s n -l nprocs -x -d 'Number of ranks'
complete -c mltrain -n "__mltrain_using $job" -l procs-per-host -x -d 'Ranks on each host'
complete -c mltrain -n "__mltrain_using $job" -l oversubscribe -d 'Allow more ranks than the hosts have slots'
complete -c mltrain -n "__mltrain_using $job" -l queue -d 'Wait in the queue for GPUs held by other jobs'
complete -c mltrain -n "__mltrain_using $job" -l queue-timeout -x -d 'Leave the queue after waiting this long'
complete -c mltrain -n "__mltrain_using $job" -s x -x -a '(set -xn)' -d 'Forward a variable of this shell (K), or set it (K=V)'
complete -c mltrain -n "__mltrain_using $job" -l master-port -x -d 'MASTER_PORT of the job'
complete -c mltrain -n "__mltrain_using $job" -l hostfile -r -F -d 'Hostfile (DeepSpeed, Open MPI or Horovod format)'
complete -c mltrain -n "__mltrain_using $job" -s H -l hosts -x -a '(__fish_print_hostnames)' -d "Hosts, e.g. 'a:4,b:4'"
complete -c mltrain -n "__mltrain_using $job" -l include -x -a '(__fish_print_hostnames)' -d 'Only these hosts/slots'
complete -c mltrain -n "__mltrain_using $job" -l exclude -x -a '(__fish_print_hostnames)' -d 'All but these hosts/slots'
complete -c mltrain -n "__mltrain_using $job" -s e -l env -x -a '(set -xn | string replace -r \'$\' =)' -d 'Set a variable for every rank (K=V)'
complete -c mltrain -n "__mltrain_using $job" -l max-restarts -x -d 'Restart the whole gang up to N times on failure'
complete -c mltrain -n "__mltrain_using $job" -l timeout -x -d 'Stop the job after this long, e.g. 90s, 2h'
complete -c mltrain -n "__mltrain_using $job" -l grace-period -x -d 'Time between SIGTERM and SIGKILL'
complete -c mltrain -n "__mltrain_using $job" -l profile -x -a '(__mltrain_profiles)' -d 'Profile to merge under the spec'
complete -c mltrain -n "__mltrain_using $job" -l name -x -d 'Job name (for run ids and records)'
complete -c mltrain -n "__mltrain_using $job" -l workdir -x -a '(__fish_complete_directories (commandline -ct))' -d 'Working directory of every rank'
complete -c mltrain -n '__mltrain_using run rerun' -l ranks -x -d 'Show only these ranks on the console, e.g. 0,3-5'
complete -c mltrain -n '__mltrain_using run rerun' -l no-prefix -d 'Print rank output without the [rank] prefix'
complete -c mltrain -n '__mltrain_using run rerun' -l timestamps -d 'Start console lines with the time'
complete -c mltrain -n "__mltrain_using $job" -l json -d 'Machine-readable output'
complete -c mltrain -n '__mltrain_using run rerun' -l dry-run -d 'Print the plan; start nothing'
complete -c mltrain -n '__mltrain_using run rerun' -s d -l detach -d 'Print the run id and leave the job running'
complete -c mltrain -n '__mltrain_using run' -l stdin -d 'Forward stdin to rank 0 (e.g. for pdb)'
complete -c mltrain -n '__mltrain_using run' -l stdin-rank -x -d 'Forward stdin to rank N'

# logs, ls, show, stop.
complete -c mltrain -n '__mltrain_using logs show stop rerun; and __mltrain_no_positional' -k -a '(__mltrain_run_ids)' -d 'Run id'
complete -c mltrain -n '__mltrain_using diff' -k -a '(__mltrain_run_ids)' -d 'Run id'
complete -c mltrain -n '__mltrain_using logs' -s f -l follow -d 'Keep printing new lines until the run ends'
complete -c mltrain -n '__mltrain_using logs' -s r -l rank -x -d 'Only these ranks, e.g. 0,3-5'
complete -c mltrain -n '__mltrain_using logs' -s g -l grep -x -d 'Only lines matching this regular expression'
complete -c mltrain -n '__mltrain_using logs' -s t -l tail -x -d 'Only the last N lines of each rank'
complete -c mltrain -n '__mltrain_using logs' -l no-prefix -d 'Print lines without the [rank] prefix'
complete -c mltrain -n '__mltrain_using logs' -l by-rank -d 'Each rank'\''s lines together, rank by rank'
complete -c mltrain -n '__mltrain_using ls show knobs diff' -l json -d 'Print as JSON'
complete -c mltrain -n '__mltrain_using ls' -l jsonl -d 'One JSON object per run and line'
complete -c mltrain -n '__mltrain_using ls' -l where -x -d 'Only the runs where FIELD OP VALUE holds'
complete -c mltrain -n '__mltrain_using ls' -l columns -x -d 'The fields to show, comma-separated'
complete -c mltrain -n '__mltrain_using ls' -s n -l newest -x -d 'Only the newest N runs'

# completions.
complete -c mltrain -n '__mltrain_using completions; and __mltrain_no_positional' -a 'bash zsh fish' -d 'Shell'

# After '--': the command to run.
complete -c mltrain -n __mltrain_after_dashdash -x -a '(__mltrain_complete_command)'
