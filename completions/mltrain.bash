# mltrain bash completion.
# Load it with:  source <(mltrain completions bash)
# or install it: mltrain completions bash > ~/.local/share/bash-completion/completions/mltrain
# Works with or without the bash-completion package (it uses its helpers when they are loaded).

# Run ids: the folders in the runs directory (the same place mltrain itself looks), plus "latest".
_mltrain_run_ids() {
    local runs="${MLTRAIN_HOME:-${XDG_STATE_HOME:-$HOME/.local/state}/mltrain}/runs"
    local d ids=()
    if [[ -d $runs ]]; then
        for d in "$runs"/*/; do
            [[ -d $d ]] || continue
            d=${d%/}
            ids+=("${d##*/}")
        done
    fi
    ids+=(latest)
    local IFS=$'\n'
    COMPREPLY+=($(compgen -W "${ids[*]}" -- "$1"))
}

# Profiles: the built-in names, the user's profiles (by name), and .toml paths once a path is typed.
_mltrain_profiles() {
    local cur=$1 p names=(local nccl-ethernet cpu-cluster)
    local dir="${XDG_CONFIG_HOME:-$HOME/.config}/mltrain/profiles"
    if [[ -d $dir ]]; then
        for p in "$dir"/*.toml; do
            [[ -f $p ]] || continue
            p=${p##*/}
            names+=("${p%.toml}")
        done
    fi
    local IFS=$'\n'
    COMPREPLY+=($(compgen -W "${names[*]}" -- "$cur"))
    if [[ $cur == */* || $cur == .* || $cur == ~* ]]; then
        _mltrain_files "$cur" toml
    fi
}

# Files (optionally only *.EXT) and directories; directories so that one can walk into them.
_mltrain_files() {
    local cur=$1 ext=$2 IFS=$'\n'
    compopt -o filenames 2>/dev/null
    if [[ -n $ext ]]; then
        COMPREPLY+=($(compgen -f -X "!*.$ext" -- "$cur") $(compgen -d -- "$cur"))
    else
        COMPREPLY+=($(compgen -f -- "$cur"))
    fi
}

_mltrain_dirs() {
    local IFS=$'\n'
    compopt -o filenames 2>/dev/null
    COMPREPLY+=($(compgen -d -- "$1"))
}

_mltrain() {
    local cur prev words cword
    COMPREPLY=()
    words=("${COMP_WORDS[@]}")
    cword=$COMP_CWORD
    cur=${words[cword]}
    prev=${words[cword - 1]}

    local cmds="run validate logs ls show stop rm gc completions knobs doctor bench top exec ssh cp export sbatch queue rerun diff sweep"
    local global_opts="-v --verbose --color"
    local job_opts="-n --nprocs --procs-per-host --oversubscribe --queue --queue-timeout --hostfile -H --hosts --include --exclude -e --env -x
        --master-port --max-restarts --timeout --grace-period --profile --name --workdir"
    # Options that take a value (the value is the next word, or follows '=').
    local with_value=" --color -n --nprocs --procs-per-host --hostfile -H --hosts --include --exclude -e --env -x
        --master-port --max-restarts --timeout --queue-timeout --grace-period --profile --name --workdir --newest --ranks -r --rank -g --grep -t --tail --stdin-rank --where --columns --resume --max-parallel "
    with_value=${with_value//$'\n'/ }

    # Find the subcommand, count the positionals after it, and notice a '--'.
    local i w cmd="" npos=0 dashdash=0
    for ((i = 1; i < cword; i++)); do
        w=${words[i]}
        if [[ $w == -- ]]; then
            dashdash=$i
            break
        fi
        case $w in
            =) continue ;;  # '--opt=value' split by COMP_WORDBREAKS: 'opt' '=' 'value'
            -*=*) continue ;;
            -*)
                if [[ $with_value == *" $w "* ]]; then
                    ((i++))
                    [[ ${words[i]} == = ]] && ((i++))
                fi
                continue
                ;;
        esac
        if [[ -z $cmd ]]; then
            cmd=$w
        else
            ((npos++))
        fi
    done

    # After '--': the command to run, and its own arguments.
    if ((dashdash > 0)); then
        if declare -F _command_offset >/dev/null; then
            _command_offset $((dashdash + 1))
            return 0
        fi
        local IFS=$'\n'
        if ((cword == dashdash + 1)); then
            COMPREPLY=($(compgen -c -- "$cur"))
            [[ $cur == */* ]] && _mltrain_files "$cur"
        else
            compopt -o default 2>/dev/null
            _mltrain_files "$cur"
        fi
        return 0
    fi

    # The value of an option: 'OPT VALUE', 'OPT=VALUE' in one word, or 'OPT' '=' 'VALUE'.
    local opt="" pre=""
    if [[ $cur == = && $prev == -* ]]; then
        opt=$prev
        cur=""
    elif [[ $prev == = && ${words[cword - 2]} == -* ]]; then
        opt=${words[cword - 2]}
    elif [[ $cur == --*=* ]]; then
        # '=' is not in COMP_WORDBREAKS: the replies must carry the 'OPT=' part.
        opt=${cur%%=*}
        pre=$opt=
        cur=${cur#*=}
    elif [[ $prev == -* && $with_value == *" $prev "* ]]; then
        opt=$prev
    fi
    if [[ -n $opt ]]; then
        case $opt in
            --color)
                COMPREPLY=($(compgen -W "auto always never" -- "$cur"))
                ;;
            --hostfile)
                _mltrain_files "$cur"
                ;;
            --workdir)
                _mltrain_dirs "$cur"
                ;;
            --profile)
                _mltrain_profiles "$cur"
                ;;
            -H | --hosts | --include | --exclude)
                # One host name; lists such as 'a:4,b:4' are left to the user.
                [[ $cur == *[,:@]* ]] || COMPREPLY=($(compgen -A hostname -- "$cur"))
                ;;
            -e | --env)
                if [[ $cur != *=* ]]; then
                    COMPREPLY=($(compgen -e -S = -- "$cur"))
                    compopt -o nospace 2>/dev/null
                fi
                ;;
            *) ;;  # a number, a duration, a name, a rank list, a pattern: nothing to offer
        esac
        [[ -n $pre ]] && ((${#COMPREPLY[@]})) && COMPREPLY=("${COMPREPLY[@]/#/$pre}")
        return 0
    fi

    # Options.
    if [[ $cur == -* ]]; then
        local flags
        case $cmd in
            "") flags="-h --help --version $global_opts" ;;
            run) flags="$job_opts --ranks --no-prefix --timestamps --dry-run --json -d --detach --stdin --stdin-rank -h --help $global_opts" ;;
            rerun) flags="$job_opts --ranks --no-prefix --timestamps --dry-run --json -d --detach -h --help $global_opts" ;;
            validate) flags="$job_opts --json -h --help $global_opts" ;;
            logs) flags="-f --follow -r --rank -g --grep -t --tail --no-prefix --by-rank -h --help $global_opts" ;;
            sweep) flags="--resume --max-parallel -h --help $global_opts" ;;
            ls) flags="--json --jsonl --where --columns -n --newest -h --help $global_opts" ;;
            show | knobs | diff) flags="--json -h --help $global_opts" ;;
            stop | completions) flags="-h --help $global_opts" ;;
            *) flags="-h --help" ;;
        esac
        [[ $cmd == run ]] && flags+=" --"
        local IFS=$' \t\n'
        COMPREPLY=($(compgen -W "$flags" -- "$cur"))
        return 0
    fi

    # The subcommand, then each subcommand's positional.
    if [[ -z $cmd ]]; then
        COMPREPLY=($(compgen -W "$cmds" -- "$cur"))
        return 0
    fi
    case $cmd in
        run | validate | sweep)
            ((npos == 0)) && _mltrain_files "$cur" toml
            ;;
        logs | show | stop | rerun)
            ((npos == 0)) && _mltrain_run_ids "$cur"
            ;;
        diff)
            ((npos < 2)) && _mltrain_run_ids "$cur"
            ;;
        completions)
            ((npos == 0)) && COMPREPLY=($(compgen -W "bash zsh fish" -- "$cur"))
            ;;
    esac
    return 0
}

complete -F _mltrain mltrain
