"""`mltrain export` against what the upstream controllers do with the manifest (issue 33, items 19-22).

- Kubeflow's training operator (v1.9.4, pkg/core/job.go PastBackoffLimit) sums restartCount over the
  job's pods and fails the job once the sum reaches runPolicy.backoffLimit: max_restarts restarts
  need backoffLimit = max_restarts + 1 (Volcano's maxRetry = max_restarts + 1 is the same count).
- Kubernetes validates label keys and values (a DNS-subdomain prefix and '/', then at most 63 of
  [A-Za-z0-9-_.], alphanumeric at both ends) and service account names (DNS subdomains): the spec
  is refused at its line instead of by the API server later.
- On Volcano a pod's activeDeadlineSeconds fails the pod, which the PodFailed policy restarts with a
  fresh clock: the container keeps the deadline instead (exit 124), and an exitCode 124 policy, first
  in the list (the controller takes the first match), aborts the job.
- "100m" of memory is a tenth of a byte; a relative workdir is the laptop's path; a worker waits for
  the master's DNS name (an init container) so its first connect does not fail.

Run: MLTRAIN_BIN=$PWD/build/mltrain /usr/bin/python3 -m pytest tests/e2e/test_export_crd.py -q -p no:cacheprovider
"""
import subprocess

import pytest

from test_export import K8S_SPEC, manifest, pods, start_pod, yaml  # noqa: F401 (yaml: skips without it)


def export(ml, to, spec="job.toml"):
    return ml("export", "--to", to, spec)


# ---- 19: restarts -------------------------------------------------------------------------------

@pytest.mark.parametrize("restarts", [1, 2, 5])
def test_pytorchjob_backoff_limit_allows_max_restarts(ml, restarts):
    ml.write("job.toml", K8S_SPEC.replace("max_restarts = 2", f"max_restarts = {restarts}"))
    doc, _ = manifest(ml, "pytorchjob")
    # The operator fails the job when the pods' restart counts sum to backoffLimit.
    assert doc["spec"]["runPolicy"]["backoffLimit"] == restarts + 1
    doc, _ = manifest(ml, "volcano")
    assert doc["spec"]["maxRetry"] == restarts + 1


def test_pytorchjob_without_restarts_never_restarts(ml):
    ml.write("job.toml", K8S_SPEC.replace("max_restarts = 2", "max_restarts = 0"))
    doc, _ = manifest(ml, "pytorchjob")
    assert doc["spec"]["runPolicy"]["backoffLimit"] == 0
    assert {v["restartPolicy"] for v in doc["spec"]["pytorchReplicaSpecs"].values()} == {"Never"}


# ---- 20: names Kubernetes refuses ----------------------------------------------------------------

@pytest.mark.parametrize("line,where,text", [
    ('node_selector = { "bad key!" = "x" }', "job.toml:23:", "node_selector 'bad key!' is not a Kubernetes label key"),
    ('node_selector = { "a/b/c" = "x" }', "job.toml:23:", "not a Kubernetes label key"),
    ('node_selector = { "Example.COM/zone" = "x" }', "job.toml:23:", "not a Kubernetes label key"),
    ('node_selector = { "zone" = "us east" }', "job.toml:23:", "node_selector 'zone' is 'us east', not a Kubernetes label value"),
    ('node_selector = { "zone" = "-east" }', "job.toml:23:", "not a Kubernetes label value"),
    ('node_selector = { "zone" = "' + "x" * 64 + '" }', "job.toml:23:", "not a Kubernetes label value"),
    ('service_account = "Trainer_SA"', "job.toml:23:", "'service_account' is 'Trainer_SA', not a Kubernetes service account name"),
    ('service_account = "a..b"', "job.toml:23:", "not a Kubernetes service account name"),
])
def test_labels_and_service_accounts_are_checked(ml, line, where, text):
    ml.write("job.toml", K8S_SPEC + line + "\n")
    for cmd in (("export", "--to", "volcano", "job.toml"), ("validate", "job.toml")):
        r = ml(*cmd)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert where in r.stderr and text in r.stderr, r.stderr
        assert "hint:" in r.stderr


def test_good_labels_and_service_accounts_pass(ml):
    ml.write("job.toml", K8S_SPEC + 'service_account = "trainer.ml-team"\n'
             'node_selector = { "nvidia.com/gpu.product" = "NVIDIA-H100-80GB-HBM3", "zone" = "", '
             '"kubernetes.io/arch" = "amd64", "Tier_2" = "A.b-c_d" }\n')
    for to in ("volcano", "pytorchjob"):
        doc, _ = manifest(ml, to)
        for _, _, pod in pods(doc):
            assert pod["serviceAccountName"] == "trainer.ml-team"
            assert pod["nodeSelector"]["zone"] == "" and pod["nodeSelector"]["Tier_2"] == "A.b-c_d"


# ---- 21: Volcano's deadline ends the job ---------------------------------------------------------

def test_volcano_timeout_ends_the_job_not_restarts_it(ml):
    ml.write("job.toml", K8S_SPEC)
    doc, _ = manifest(ml, "volcano")
    policies = doc["spec"]["policies"]
    # The first matching policy wins: the deadline's exit code before PodFailed's RestartJob.
    assert policies[0] == {"exitCode": 124, "action": "AbortJob"}
    assert {(p.get("event"), p["action"]) for p in policies[1:]} == {("PodEvicted", "RestartJob"),
                                                                     ("PodFailed", "RestartJob")}
    for _, _, pod in pods(doc):
        # A pod deadline would fail the pod (PodFailed: a restart with a fresh clock).
        assert "activeDeadlineSeconds" not in pod
        assert "timeout -k 5 7200" in pod["containers"][0]["command"][2]


def test_volcano_pod_exits_124_at_the_deadline(ml, tmp_path):
    ml.write("job.toml", K8S_SPEC.replace('argv = ["python3", "train.py", "--epochs", "10"]',
                                          "command = 'echo started; sleep 30'")
             .replace('timeout = "2h"', 'timeout = "1s"').replace("procs_per_host = 4", "procs_per_host = 1"))
    doc, _ = manifest(ml, "volcano")
    (_, _, master) = pods(doc)[0]
    c = master["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    r = subprocess.run(c["command"] + c["args"], env=dict(env, PATH="/usr/bin:/bin"), capture_output=True,
                       text=True, timeout=20)
    assert r.returncode == 124 and "started" in r.stdout, (r.returncode, r.stdout, r.stderr)


def test_volcano_without_timeout_has_no_deadline_policy(ml):
    ml.write("job.toml", K8S_SPEC.replace('timeout = "2h"\n', ""))
    doc, _ = manifest(ml, "volcano")
    assert all("exitCode" not in p for p in doc["spec"]["policies"])
    assert all("timeout" not in pod["containers"][0]["command"][2] for _, _, pod in pods(doc))


def test_pytorchjob_keeps_its_job_deadline(ml):
    ml.write("job.toml", K8S_SPEC)
    doc, _ = manifest(ml, "pytorchjob")
    assert doc["spec"]["runPolicy"]["activeDeadlineSeconds"] == 7200


# ---- 22: memory, workdir, the comm library, the master's name ----------------------------------

@pytest.mark.parametrize("value,suggest", [("100m", '"100Mi"'), ("64u", '"64Mi"')])
def test_memory_in_thousandths_of_a_byte_is_refused(ml, value, suggest):
    ml.write("job.toml", K8S_SPEC.replace('memory = "64Gi"', f'memory = "{value}"'))
    r = export(ml, "volcano")
    assert r.returncode == 2 and "job.toml:22:" in r.stderr, r.stderr
    assert f"'memory' is '{value}'" in r.stderr and "of a byte" in r.stderr and suggest in r.stderr


def test_cpu_in_thousandths_is_fine(ml):
    ml.write("job.toml", K8S_SPEC.replace('cpu = "16"', 'cpu = "500m"'))
    doc, _ = manifest(ml, "volcano")
    assert pods(doc)[0][2]["containers"][0]["resources"]["limits"]["cpu"] == "500m"


def test_relative_workdir_warns(ml):
    ml.write("job.toml", K8S_SPEC.replace('workdir = "/workspace"', 'workdir = "src"'))
    r = export(ml, "volcano")
    assert r.returncode == 0, r.stderr
    assert "mltrain: warning: " in r.stderr and "job.toml:5:" in r.stderr, r.stderr
    assert "is this machine's folder" in r.stderr and 'workdir = "/workspace"' in r.stderr
    assert "# Warning: " in r.stdout
    ml.write("job.toml", K8S_SPEC)
    assert export(ml, "volcano").stderr == ""


def test_comm_library_backend_warns_and_header_says_it(ml):
    ml.write("job.toml", K8S_SPEC + '[comm]\nbackend = "tcp"\n')
    r = export(ml, "pytorchjob")
    assert r.returncode == 0, r.stderr
    assert "mltrain: warning: " in r.stderr and "mltrain's comm library" in r.stderr, r.stderr
    ml.write("job.toml", K8S_SPEC)
    r = export(ml, "pytorchjob")
    assert "do not run there" in r.stdout and "comm library" in r.stdout


@pytest.mark.parametrize("to,master", [("volcano", "train-master-0.train"), ("pytorchjob", "train-master-0")])
def test_workers_wait_for_the_masters_name(ml, tmp_path, to, master):
    ml.write("job.toml", K8S_SPEC)
    doc, _ = manifest(ml, to)
    (_, _, m), (_, _, w) = pods(doc)
    assert "initContainers" not in m
    (init,) = w["initContainers"]
    assert init["image"] == "ghcr.io/acme/train:1.4"
    assert init["command"][-1] == master
    # It returns once the name resolves, and gives up (exit 1, saying so) after 300 s.
    r = subprocess.run(init["command"][:-1] + ["localhost"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert "did not resolve in 300 s" in init["command"][2]
