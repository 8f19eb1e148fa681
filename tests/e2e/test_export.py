"""`mltrain export --to volcano|pytorchjob JOB.toml`: the manifest parses as YAML, fits the CRDs, and
says what the job says (pods, ranks, GPUs, rank environment, restarts); secrets are never printed;
a spec that cannot be exported is a located error (exit 2).

Run: MLTRAIN_BIN=$PWD/build/mltrain /usr/bin/python3 -m pytest tests/e2e/test_export.py -q -p no:cacheprovider
Needs python3-yaml (scripts/setup.sh --test-deps); skips without it.

The CRD check walks the parsed manifest against trimmed copies of the published schemas (below):
at every level mltrain writes, each key must be a property the CRD declares, each required
property must be there, and the leaves mltrain writes must have the CRD's type (quantities its
pattern). Only the property names are copied, from:
  volcano-sh/volcano config/crd/volcano/bases/batch.volcano.sh_jobs.yaml (batch.volcano.sh/v1alpha1)
  kubeflow/training-operator manifests/base/crds/kubeflow.org_pytorchjobs.yaml (kubeflow.org/v1)
Both embed the Kubernetes core PodTemplateSpec; its PodSpec/Container/EnvVar names are core v1's.
Event and action names come from Volcano's docs/user-guide/how_to_use_job_policy.md (the CRD has
them as free strings), restart and clean-pod policies from the PyTorchJob CRD's descriptions.
"""
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="python3-yaml is not installed (apt-get install python3-yaml)")

REPO = Path(__file__).resolve().parents[2]

# ---- trimmed CRD schemas -------------------------------------------------------------------------

STR = {"type": "string"}
INT = {"type": "integer"}
BOOL = {"type": "boolean"}
ANY = {}  # a property mltrain never writes: its name is allowed, its content is not checked here
# The CRDs' pattern for resource quantities (x-kubernetes-int-or-string).
QUANTITY = {"quantity": re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")}


def obj(props, required=()):
    return {"type": "object", "properties": props, "required": list(required)}


def arr(items):
    return {"type": "array", "items": items}


def map_of(values):
    return {"type": "object", "additionalProperties": values}


def enum(*values):
    return {"type": "string", "enum": list(values)}


ENV_VAR = obj({
    "name": STR, "value": STR,
    "valueFrom": obj({
        "configMapKeyRef": ANY, "fieldRef": ANY, "resourceFieldRef": ANY,
        "secretKeyRef": obj({"key": STR, "name": STR, "optional": BOOL}, required=["key"]),
    }),
}, required=["name"])

CONTAINER = obj({
    "args": arr(STR), "command": arr(STR), "env": arr(ENV_VAR), "envFrom": ANY, "image": STR,
    "imagePullPolicy": ANY, "lifecycle": ANY, "livenessProbe": ANY, "name": STR,
    "ports": arr(obj({"containerPort": INT, "hostIP": STR, "hostPort": INT, "name": STR, "protocol": STR},
                     required=["containerPort"])),
    "readinessProbe": ANY, "resizePolicy": ANY,
    "resources": obj({"claims": ANY, "limits": map_of(QUANTITY), "requests": map_of(QUANTITY)}),
    "restartPolicy": ANY, "securityContext": ANY, "startupProbe": ANY, "stdin": ANY, "stdinOnce": ANY,
    "terminationMessagePath": ANY, "terminationMessagePolicy": ANY, "tty": ANY, "volumeDevices": ANY,
    "volumeMounts": arr(obj({"mountPath": STR, "mountPropagation": STR, "name": STR, "readOnly": BOOL,
                             "subPath": STR, "subPathExpr": STR}, required=["mountPath", "name"])),
    "workingDir": STR,
}, required=["name"])

VOLUME_NAMES = ["awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "configMap", "csi",
                "downwardAPI", "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk", "gitRepo",
                "glusterfs", "hostPath", "iscsi", "nfs", "persistentVolumeClaim", "photonPersistentDisk",
                "portworxVolume", "projected", "quobyte", "rbd", "scaleIO", "secret", "storageos",
                "vsphereVolume"]
VOLUME = obj({"name": STR, "emptyDir": obj({"medium": STR, "sizeLimit": QUANTITY}),
              **{n: ANY for n in VOLUME_NAMES}}, required=["name"])

POD_SPEC_NAMES = ["affinity", "automountServiceAccountToken", "dnsConfig", "dnsPolicy", "enableServiceLinks",
                  "ephemeralContainers", "hostAliases", "hostIPC", "hostNetwork", "hostPID", "hostUsers",
                  "hostname", "imagePullSecrets", "initContainers", "nodeName", "os", "overhead",
                  "preemptionPolicy", "priority", "priorityClassName", "readinessGates", "resourceClaims",
                  "runtimeClassName", "schedulerName", "schedulingGates", "securityContext", "serviceAccount",
                  "setHostnameAsFQDN", "shareProcessNamespace", "subdomain", "tolerations",
                  "topologySpreadConstraints"]
POD_SPEC = obj({
    "activeDeadlineSeconds": INT, "containers": arr(CONTAINER), "nodeSelector": map_of(STR),
    "restartPolicy": enum("Always", "OnFailure", "Never"), "serviceAccountName": STR,
    "terminationGracePeriodSeconds": INT, "volumes": arr(VOLUME), **{n: ANY for n in POD_SPEC_NAMES},
}, required=["containers"])
POD_TEMPLATE = obj({"metadata": ANY, "spec": POD_SPEC})

VOLCANO_EVENTS = enum("PodFailed", "PodEvicted", "PodPending", "TaskCompleted", "Unknown", "*")
VOLCANO_ACTIONS = enum("AbortJob", "RestartJob", "RestartTask", "RestartPod", "RestartPartition",
                       "TerminateJob", "CompleteJob")
VOLCANO_POLICY = obj({"action": VOLCANO_ACTIONS, "event": VOLCANO_EVENTS, "events": arr(VOLCANO_EVENTS),
                      "exitCode": INT, "timeout": STR})
VOLCANO_JOB = obj({
    "apiVersion": STR, "kind": STR, "metadata": obj({"name": STR, "namespace": STR}, required=["name"]),
    "spec": obj({
        "maxRetry": INT, "minAvailable": INT, "minSuccess": INT, "plugins": map_of(arr(STR)),
        "policies": arr(VOLCANO_POLICY), "priorityClassName": STR, "queue": STR, "runningEstimate": STR,
        "schedulerName": STR,
        "tasks": arr(obj({"dependsOn": ANY, "maxRetry": INT, "minAvailable": INT, "name": STR,
                          "policies": arr(VOLCANO_POLICY), "replicas": INT, "template": POD_TEMPLATE,
                          "topologyPolicy": STR})),
        "ttlSecondsAfterFinished": INT, "volumes": ANY,
    }),
    "status": ANY,
})

REPLICA_SPEC = obj({"replicas": INT, "restartPolicy": enum("Always", "OnFailure", "Never", "ExitCode"),
                    "template": POD_TEMPLATE})
PYTORCH_JOB = obj({
    "apiVersion": STR, "kind": STR, "metadata": obj({"name": STR, "namespace": STR}, required=["name"]),
    "spec": obj({
        "elasticPolicy": ANY, "nprocPerNode": STR,
        # additionalProperties in the CRD; the operator accepts the replica types Master and Worker.
        "pytorchReplicaSpecs": obj({"Master": REPLICA_SPEC, "Worker": REPLICA_SPEC}),
        "runPolicy": obj({
            "activeDeadlineSeconds": INT, "backoffLimit": INT, "cleanPodPolicy": enum("All", "Running", "None"),
            "managedBy": STR,
            "schedulingPolicy": obj({"minAvailable": INT, "minResources": ANY, "priorityClass": STR,
                                     "queue": STR, "scheduleTimeoutSeconds": INT}),
            "suspend": BOOL, "ttlSecondsAfterFinished": INT,
        }),
    }, required=["pytorchReplicaSpecs"]),
    "status": ANY,
})


def schema_errors(value, schema, path="$"):
    """Every way `value` departs from the trimmed schema, as 'path: what' lines."""
    errs = []
    if "quantity" in schema:
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, str) and schema["quantity"].match(value))
        return [] if ok else [f"{path}: {value!r} is not a quantity"]
    t = schema.get("type")
    if t == "object":
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        props = schema.get("properties")
        for k, v in value.items():
            if props is not None:
                if k not in props:
                    errs.append(f"{path}: {k!r} is not a property the CRD declares here")
                else:
                    errs += schema_errors(v, props[k], f"{path}.{k}")
            elif "additionalProperties" in schema:
                errs += schema_errors(v, schema["additionalProperties"], f"{path}.{k}")
        for r in schema.get("required", []):
            if r not in value:
                errs.append(f"{path}: the required {r!r} is missing")
    elif t == "array":
        if not isinstance(value, list):
            return [f"{path}: expected an array, got {type(value).__name__}"]
        for i, item in enumerate(value):
            errs += schema_errors(item, schema["items"], f"{path}[{i}]")
    elif t == "string" and not isinstance(value, str):
        errs.append(f"{path}: expected a string, got {value!r}")
    elif t == "integer" and (not isinstance(value, int) or isinstance(value, bool)):
        errs.append(f"{path}: expected an integer, got {value!r}")
    elif t == "boolean" and not isinstance(value, bool):
        errs.append(f"{path}: expected a boolean, got {value!r}")
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{path}: {value!r} is not one of {schema['enum']}")
    return errs


def test_checker_catches_what_it_should():
    """The checker itself: an unknown key, a missing required one, a wrong type, a bad quantity."""
    doc = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "x"},
           "spec": {"nprocPerNode": 4, "runPolicy": {"backofLimit": 1},
                    "pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {"spec": {
                        "containers": [{"image": "i", "resources": {"limits": {"memory": "64GB"}}}]}}}}}}
    errs = "\n".join(schema_errors(doc, PYTORCH_JOB))
    assert "nprocPerNode: expected a string" in errs
    assert "'backofLimit' is not a property" in errs
    assert "the required 'name' is missing" in errs
    assert "'64GB' is not a quantity" in errs


# ---- helpers -------------------------------------------------------------------------------------

K8S_SPEC = """\
name = "train"

[run]
argv = ["python3", "train.py", "--epochs", "10"]
workdir = "/workspace"
max_restarts = 2
timeout = "2h"

[run.env]
OMP_NUM_THREADS = 4

[cluster]
procs_per_host = 4

[gpus]
per_proc = 1

[k8s]
image = "ghcr.io/acme/train:1.4"
nodes = 3
cpu = "16"
memory = "64Gi"
"""


def export(ml, to, spec="job.toml", *extra, env=None):
    r = ml("export", "--to", to, spec, *extra, env=env)
    return r


def manifest(ml, to, spec="job.toml", *extra, env=None, warnings=False):
    r = export(ml, to, spec, *extra, env=env)
    assert r.returncode == 0, r.stderr
    if warnings:
        assert all(line.startswith("mltrain: warning: ") for line in r.stderr.splitlines()), r.stderr
    else:
        assert r.stderr == ""
    doc = yaml.safe_load(r.stdout)
    schema = VOLCANO_JOB if to == "volcano" else PYTORCH_JOB
    errs = schema_errors(doc, schema)
    assert not errs, "the manifest does not fit the CRD:\n" + "\n".join(errs)
    return doc, r.stdout


def pods(doc):
    """(name, replicas, pod spec) of each task or replica type."""
    if doc["kind"] == "Job":
        return [(t["name"], t["replicas"], t["template"]["spec"]) for t in doc["spec"]["tasks"]]
    return [(k, v["replicas"], v["template"]["spec"]) for k, v in doc["spec"]["pytorchReplicaSpecs"].items()]


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# ---- Volcano -------------------------------------------------------------------------------------

def test_volcano_job(ml):
    ml.write("job.toml", K8S_SPEC)
    doc, _ = manifest(ml, "volcano")
    assert doc["apiVersion"] == "batch.volcano.sh/v1alpha1" and doc["kind"] == "Job"
    assert doc["metadata"] == {"name": "train"}
    spec = doc["spec"]
    assert spec["schedulerName"] == "volcano"
    assert spec["plugins"] == {"svc": [], "env": []}
    # Gang: every pod or none.
    assert [(n, r) for n, r, _ in pods(doc)] == [("master", 1), ("worker", 2)]
    assert spec["minAvailable"] == 3 == sum(r for _, r, _ in pods(doc))
    # Volcano counts the retry before it checks it: 2 restarts need maxRetry 3.
    assert spec["maxRetry"] == 3
    # The deadline (exit 124 from the container) aborts; test_export_crd.py has why.
    assert {(p.get("event"), p.get("exitCode"), p["action"]) for p in spec["policies"]} == {
        (None, 124, "AbortJob"), ("PodEvicted", None, "RestartJob"), ("PodFailed", None, "RestartJob")}
    for name, _, pod in pods(doc):
        assert pod["restartPolicy"] == "Never"  # a failed pod fails; the policy restarts the gang
        assert "timeout -k 5 7200" in pod["containers"][0]["command"][2]
        assert pod["terminationGracePeriodSeconds"] == 5
        (c,) = pod["containers"]
        assert c["image"] == "ghcr.io/acme/train:1.4"
        assert c["args"] == ["python3", "train.py", "--epochs", "10"]
        assert c["workingDir"] == "/workspace"
        assert c["resources"]["limits"] == {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": 4}
        assert c["resources"]["requests"] == {"cpu": "16", "memory": "64Gi"}
        env = env_of(c)
        assert env["MASTER_ADDR"] == "train-master-0.train"  # the svc plugin's name for the master pod
        assert env["MASTER_PORT"] == "29500"
        assert env["WORLD_SIZE"] == "12" and env["LOCAL_WORLD_SIZE"] == "4"
        assert env["OMP_NUM_THREADS"] == "4"
        line = c["command"][2]
        assert c["command"][:2] == ["/bin/sh", "-c"]
        assert "torchrun --nnodes=3 --nproc_per_node=4" in line
        assert ("NODE_RANK=0;" if name == "master" else "NODE_RANK=$((VK_TASK_INDEX + 1));") in line


def test_volcano_without_restarts_aborts(ml):
    ml.write("job.toml", K8S_SPEC.replace("max_restarts = 2", "max_restarts = 0"))
    doc, _ = manifest(ml, "volcano")
    assert {p["action"] for p in doc["spec"]["policies"]} == {"AbortJob"}
    assert doc["spec"]["maxRetry"] == 1


def test_one_node_has_no_workers(ml):
    ml.write("job.toml", K8S_SPEC.replace("nodes = 3", "nodes = 1"))
    doc, _ = manifest(ml, "volcano")
    assert [(n, r) for n, r, _ in pods(doc)] == [("master", 1)]
    assert doc["spec"]["minAvailable"] == 1
    doc, _ = manifest(ml, "pytorchjob")
    assert list(doc["spec"]["pytorchReplicaSpecs"]) == ["Master"]


# ---- PyTorchJob ----------------------------------------------------------------------------------

def test_pytorchjob(ml):
    ml.write("job.toml", K8S_SPEC.replace('name = "train"', 'name = "train"\n[comm]\nmaster_port = 23456'))
    doc, _ = manifest(ml, "pytorchjob")
    assert doc["apiVersion"] == "kubeflow.org/v1" and doc["kind"] == "PyTorchJob"
    spec = doc["spec"]
    assert [(n, r) for n, r, _ in pods(doc)] == [("Master", 1), ("Worker", 2)]
    assert spec["nprocPerNode"] == "4"
    assert spec["runPolicy"]["backoffLimit"] == 3  # 2 restarts: the operator's PastBackoffLimit
    assert spec["runPolicy"]["schedulingPolicy"] == {"minAvailable": 3}
    assert spec["runPolicy"]["activeDeadlineSeconds"] == 7200
    for name, _, pod in pods(doc):
        assert spec["pytorchReplicaSpecs"][name]["restartPolicy"] == "OnFailure"
        (c,) = pod["containers"]
        assert c["name"] == "pytorch"  # the operator finds its container by this name
        assert c["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456}]
        env = env_of(c)
        # The operator sets these itself; a second value would be ambiguous.
        assert not {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"} & set(env)
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
        assert "NODE_RANK=$RANK;" in c["command"][2]


def test_pytorchjob_without_restarts(ml):
    ml.write("job.toml", K8S_SPEC.replace("max_restarts = 2", "max_restarts = 0"))
    doc, _ = manifest(ml, "pytorchjob")
    assert doc["spec"]["runPolicy"]["backoffLimit"] == 0
    assert {v["restartPolicy"] for v in doc["spec"]["pytorchReplicaSpecs"].values()} == {"Never"}


# ---- the [k8s] fields ----------------------------------------------------------------------------

def test_k8s_fields(ml):
    ml.write("job.toml", K8S_SPEC + """\
namespace = "ml-team"
service_account = "trainer"
node_selector = { "nvidia.com/gpu.product" = "NVIDIA-H100-80GB-HBM3", "yes" = "no" }
env = { HF_HOME = "/cache/hf", OMP_NUM_THREADS = 8 }
""")
    for to in ("volcano", "pytorchjob"):
        doc, _ = manifest(ml, to)
        assert doc["metadata"] == {"name": "train", "namespace": "ml-team"}
        for _, _, pod in pods(doc):
            assert pod["serviceAccountName"] == "trainer"
            # "yes" must stay a string key, not become the boolean True.
            assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "yes": "no"}
            env = env_of(pod["containers"][0])
            assert env["HF_HOME"] == "/cache/hf"
            assert env["OMP_NUM_THREADS"] == "8"  # [k8s] env over [run] env
            names = [e["name"] for e in pod["containers"][0]["env"]]
            assert len(names) == len(set(names))


def test_gpus_default_and_shared(ml):
    base = K8S_SPEC.replace("[gpus]\nper_proc = 1\n", "")
    ml.write("job.toml", base.replace("[k8s]", "[gpus]\nper_proc = 2\n[k8s]"))
    doc, _ = manifest(ml, "volcano")
    (c,) = pods(doc)[0][2]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8  # per_proc x procs_per_host
    ml.write("job.toml", base.replace("[k8s]", "[gpus]\nprocs_per_gpu = 2\n[k8s]"))
    doc, _ = manifest(ml, "volcano")
    (c,) = pods(doc)[0][2]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2  # 4 ranks, 2 per GPU
    ml.write("job.toml", base)
    doc, _ = manifest(ml, "volcano")
    (c,) = pods(doc)[0][2]["containers"]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]  # no [gpus]: no GPU asked
    assert "CUDA_VISIBLE_DEVICES" not in env_of(c)


def test_nodes_default_to_the_planned_hosts(ml):
    spec = K8S_SPEC.replace("nodes = 3\n", "").replace("procs_per_host = 4", 'hosts = ["a:2", "b:2", "c:2", "d:2"]')
    ml.write("job.toml", spec.replace("[gpus]\nper_proc = 1\n", ""))
    doc, _ = manifest(ml, "volcano")
    assert doc["spec"]["minAvailable"] == 4
    assert env_of(pods(doc)[0][2]["containers"][0])["WORLD_SIZE"] == "8"
    # No hosts at all: one pod with the ranks -n asks for.
    ml.write("job.toml", K8S_SPEC.replace("nodes = 3\n", "").replace("procs_per_host = 4", "nprocs = 2"))
    doc, _ = manifest(ml, "volcano")
    assert [(n, r) for n, r, _ in pods(doc)] == [("master", 1)]
    assert "--nproc_per_node=2" in pods(doc)[0][2]["containers"][0]["command"][2]


def test_flags_override_the_spec(ml):
    ml.write("job.toml", K8S_SPEC)
    doc, _ = manifest(ml, "volcano", "job.toml", "--procs-per-host", "2", "--max-restarts", "5")
    assert doc["spec"]["maxRetry"] == 6
    assert env_of(pods(doc)[0][2]["containers"][0])["WORLD_SIZE"] == "6"


def test_shell_command_and_workdir(ml):
    ml.write("job.toml", K8S_SPEC.replace('argv = ["python3", "train.py", "--epochs", "10"]',
                                          "command = 'cd src && python3 train.py \"$@\"'")
             .replace('workdir = "/workspace"\n', ""))
    doc, _ = manifest(ml, "volcano")
    (c,) = pods(doc)[0][2]["containers"]
    assert c["args"] == ["/bin/sh", "-c", 'cd src && python3 train.py "$@"']
    assert "workingDir" not in c


def test_header_names_what_is_not_exported(ml):
    ml.write("job.toml", K8S_SPEC.replace("timeout = ", 'forward_env = ["WANDB_*", "HF_HOME"]\ntimeout = ')
             + 'env = { HF_HOME = "/cache" }\n[sync]\n')
    _, text = manifest(ml, "volcano")
    notes = [line for line in text.splitlines() if line.startswith("# Not exported:")]
    assert notes == ["# Not exported: [run] forward_env WANDB_* (no launcher environment in a cluster: "
                     "name them in [k8s] env); [sync] and [setup] (the image holds the code)."]


def test_output_is_deterministic(ml):
    ml.write("job.toml", K8S_SPEC + 'env = { B = "2", A = "1", HF_TOKEN = "x" }\n')
    outs = {export(ml, "volcano").stdout for _ in range(3)}
    assert len(outs) == 1


# ---- quoting -------------------------------------------------------------------------------------

TRICKY = [
    "yes", "no", "null", "~", "true", "0x1F", "1e3", "010", "- a", ": b", "# c", "*ref", "&a", "!tag",
    "%TAG", "@x", "`y`", "{a: 1}", "[1, 2]", "a: b # c", "' single", '"double"', "back\\slash",
    "tab\there", "new\nline", "cr\rret", "\x01ctl\x7f", "caf\u00e9 \u2603 \U0001F600", "nel\u0085",
    "ls\u2028ps\u2029", "bom\ufeff", "c1\u0090", "  lead and trail  ", "", "---", "...", "<<",
]


def toml_string(s):
    """A TOML basic string holding `s` exactly."""
    out = '"'
    for ch in s:
        if ch in '"\\':
            out += "\\" + ch
        elif ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F or ch in "\u2028\u2029\ufeff":
            out += "\\u%04x" % ord(ch)
        else:
            out += ch
    return out + '"'


def test_every_string_round_trips(ml):
    env = "\n".join(f"V{i} = {toml_string(s)}" for i, s in enumerate(TRICKY))
    argv = ", ".join(toml_string(s) for s in TRICKY)
    spec = K8S_SPEC.replace('argv = ["python3", "train.py", "--epochs", "10"]', f"argv = [{argv}]")
    ml.write("job.toml", spec.replace("[run.env]\n", "[run.env]\n" + env + "\n"))
    for to in ("volcano", "pytorchjob"):
        doc, text = manifest(ml, to)
        (c,) = pods(doc)[0][2]["containers"]
        assert c["args"] == TRICKY
        got = env_of(c)
        for i, s in enumerate(TRICKY):
            assert got[f"V{i}"] == s, (i, s)
        # Every string is double-quoted: a value never starts a line as a plain scalar.
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            body = line.strip().removeprefix("- ")
            if ":" in body and not body.startswith('"'):
                body = body.split(":", 1)[1].strip()
            assert body == "" or body[0] == '"' or re.fullmatch(r"-?\d+|true|false|\[\]|\{\}", body), line


# ---- secrets -------------------------------------------------------------------------------------

SECRET_VALUES = ["s3cr3t-api-value-1", "s3cr3t-token-value-2", "s3cr3t-pass-value-3", "s3cr3t-custom-4"]


def test_secrets_are_references_never_values(ml):
    ml.write("job.toml", K8S_SPEC.replace("[run.env]\n", f"""[run.env]
WANDB_API_KEY = "{SECRET_VALUES[0]}"
HF_TOKEN = "{SECRET_VALUES[1]}"
""") + f"""namespace = "ml"
env = {{ DB_PASSWORD = "{SECRET_VALUES[2]}", DB_URL = "{SECRET_VALUES[3]}", PLAIN = "visible" }}
""")
    for to in ("volcano", "pytorchjob"):
        r = export(ml, to, env={"MLTRAIN_SECRET_VARS": "DB_U*"})
        assert r.returncode == 0, r.stderr
        for v in SECRET_VALUES:
            assert v not in r.stdout and v not in r.stderr
        doc = yaml.safe_load(r.stdout)
        assert not schema_errors(doc, VOLCANO_JOB if to == "volcano" else PYTORCH_JOB)
        for _, _, pod in pods(doc):
            env = env_of(pod["containers"][0])
            for k in ("WANDB_API_KEY", "HF_TOKEN", "DB_PASSWORD", "DB_URL"):
                assert env[k] == {"secretKeyRef": {"name": "train-env", "key": k}}, k
            assert env["PLAIN"] == "visible"
        # The header says which Secret to create, and with which keys (never the values).
        assert '# The Secret "train-env" must hold' in r.stdout
        (create,) = [line for line in r.stdout.splitlines() if "kubectl create secret" in line]
        assert create.startswith("#   kubectl create secret generic train-env -n ml --from-literal=")
        for k in ("WANDB_API_KEY", "HF_TOKEN", "DB_PASSWORD", "DB_URL"):
            assert f" --from-literal={k}=..." in create


def test_k8s_env_secrets_stay_out_of_validate_and_records(ml):
    """[k8s] env is for export, but a secret's value there must not reach any other output."""
    ml.write("job.toml", "[run]\ncommand = 'true'\n[k8s]\nimage = 'i'\n"
                         f"env = {{ API_KEY = '{SECRET_VALUES[0]}' }}\n")
    r = ml("validate", "job.toml")
    assert r.returncode == 0, r.stderr
    r = ml("run", "job.toml", "-n", "1")
    assert r.returncode == 0, r.stderr
    (run_dir,) = ml.run_dirs()
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert SECRET_VALUES[0] not in f.read_text(errors="replace"), f


# ---- what the pods run ---------------------------------------------------------------------------

FAKE_TORCHRUN = r"""#!/usr/bin/python3
# torchrun's static rendezvous, as far as the pod's start line uses it: one process per local rank.
import os, subprocess, sys
args, i, opts = sys.argv[1:], 0, {}
while args[i].startswith("--"):
    if args[i] == "--no_python":
        opts["no_python"] = True
    else:
        k, v = args[i][2:].split("=", 1)
        opts[k] = v
    i += 1
assert opts.get("no_python"), opts
nnodes, nproc, node = int(opts["nnodes"]), int(opts["nproc_per_node"]), int(opts["node_rank"])
print(f"torchrun master={opts['master_addr']}:{opts['master_port']}", flush=True)
for local in range(nproc):
    env = dict(os.environ, LOCAL_RANK=str(local), RANK=str(node * nproc + local),
               WORLD_SIZE=str(nnodes * nproc), LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK=str(node))
    subprocess.run(args[i:], env=env, check=True)
"""

PRINT_RANK = "echo rank=$RANK local=$LOCAL_RANK node=$NODE_RANK group=$GROUP_RANK world=$WORLD_SIZE " \
             "lws=$LOCAL_WORLD_SIZE cvd=${CUDA_VISIBLE_DEVICES-unset} master=$MASTER_ADDR:$MASTER_PORT"


def start_pod(tmp_path, container, extra_env):
    """Runs the container's command and args as the pod would, with a fake torchrun in PATH."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    tr = bin_dir / "torchrun"
    tr.write_text(FAKE_TORCHRUN)
    tr.chmod(tr.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
    env.update(extra_env)
    r = subprocess.run(container["command"] + container["args"], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    return [line for line in r.stdout.splitlines() if line.startswith("rank=")], r.stdout


@pytest.mark.parametrize("to", ["volcano", "pytorchjob"])
def test_pods_start_the_ranks_torchrun_would(ml, tmp_path, to):
    ml.write("job.toml", K8S_SPEC.replace('argv = ["python3", "train.py", "--epochs", "10"]',
                                          f"command = '{PRINT_RANK}'")
             .replace("[gpus]\nper_proc = 1", "[gpus]\nper_proc = 2").replace("procs_per_host = 4",
                                                                              "procs_per_host = 2"))
    doc, _ = manifest(ml, to)
    (name, _, worker) = pods(doc)[1]
    # The second worker pod: node 2. Volcano's env plugin gives its index in the task; the
    # training operator gives RANK (the pod's rank) and the master's address.
    extra = ({"VK_TASK_INDEX": "1", "VC_TASK_INDEX": "1"} if to == "volcano" else
             {"RANK": "2", "WORLD_SIZE": "6", "MASTER_ADDR": "train-master-0", "MASTER_PORT": "29500"})
    ranks, out = start_pod(tmp_path, worker["containers"][0], extra)
    master = "train-master-0.train:29500" if to == "volcano" else "train-master-0:29500"
    assert f"torchrun master={master}" in out
    assert ranks == [
        f"rank=4 local=0 node=2 group=2 world=6 lws=2 cvd=0,1 master={master}",
        f"rank=5 local=1 node=2 group=2 world=6 lws=2 cvd=2,3 master={master}",
    ]


@pytest.mark.parametrize("to", ["volcano", "pytorchjob"])
def test_one_rank_per_pod_runs_without_torchrun(ml, tmp_path, to):
    ml.write("job.toml", K8S_SPEC.replace('argv = ["python3", "train.py", "--epochs", "10"]',
                                          f"command = '{PRINT_RANK}'").replace("procs_per_host = 4",
                                                                              "procs_per_host = 1"))
    doc, _ = manifest(ml, to)
    (_, _, master_pod), (_, _, worker_pod) = pods(doc)
    extra = ({"VK_TASK_INDEX": "0"} if to == "volcano" else
             {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "train-master-0", "MASTER_PORT": "29500"})
    ranks, out = start_pod(tmp_path, worker_pod["containers"][0], extra)
    assert "torchrun" not in out
    master = "train-master-0.train:29500" if to == "volcano" else "train-master-0:29500"
    assert ranks == [f"rank=1 local=0 node=1 group=1 world=3 lws=1 cvd=0 master={master}"]
    extra = {} if to == "volcano" else {"RANK": "0", "MASTER_ADDR": "train-master-0", "MASTER_PORT": "29500"}
    ranks, _ = start_pod(tmp_path, master_pod["containers"][0], extra)
    assert ranks == [f"rank=0 local=0 node=0 group=0 world=3 lws=1 cvd=0 master={master}"]


def test_procs_per_gpu_shares_gpus(ml, tmp_path):
    ml.write("job.toml", K8S_SPEC.replace('argv = ["python3", "train.py", "--epochs", "10"]',
                                          f"command = '{PRINT_RANK}'")
             .replace("[gpus]\nper_proc = 1", "[gpus]\nprocs_per_gpu = 2"))
    doc, _ = manifest(ml, "volcano")
    ranks, _ = start_pod(tmp_path, pods(doc)[0][2]["containers"][0], {})
    assert [r.split()[6] for r in ranks] == ["cvd=0", "cvd=0", "cvd=1", "cvd=1"]


# ---- the examples --------------------------------------------------------------------------------

def test_example_k8s_spec(ml):
    for to in ("volcano", "pytorchjob"):
        doc, text = manifest(ml, to, str(REPO / "examples" / "k8s.toml"))
        assert doc["metadata"]["name"] == "train"
        # Its forward_env variable is named in [k8s] env (from the Secret): nothing is left out.
        assert "Not exported" not in text
        for _, _, pod in pods(doc):
            assert env_of(pod["containers"][0])["WANDB_API_KEY"] == {
                "secretKeyRef": {"name": "train-env", "key": "WANDB_API_KEY"}}
    r = ml("validate", str(REPO / "examples" / "k8s.toml"))
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("example", sorted(p.name for p in (REPO / "examples").glob("*.toml")
                                           if p.name != "k8s.toml"))
def test_every_example_exports_with_an_image(ml, example):
    """The other examples have no [k8s]: a located error, then fine once they get an image."""
    src = REPO / "examples" / example
    r = ml("export", "--to", "volcano", str(src))
    assert r.returncode == 2 and "no [k8s] table" in r.stderr and str(src) in r.stderr
    copy = ml.write(example, src.read_text() + '\n[k8s]\nimage = "registry.example/job:1"\n')
    for to in ("volcano", "pytorchjob"):
        doc, _ = manifest(ml, to, str(copy), warnings=True)  # workdir "." is this machine's
        assert all(p["containers"][0]["image"] == "registry.example/job:1" for _, _, p in pods(doc))


# ---- errors --------------------------------------------------------------------------------------

def loc(line, col=r"\d+"):
    return rf"job\.toml:{line}:{col}"


ERROR_CASES = [
    ("no-image", "[run]\ncommand = 'x'\n[k8s]\nnamespace = 'ml'\n", loc(3, 1), "[k8s] has no 'image'"),
    ("procs-per-gpu-no-gpus", "[run]\ncommand = 'x'\n[gpus]\nprocs_per_gpu = 2\n[k8s]\nimage = 'i'\ngpus_per_pod = 0\n",
     loc(7), "gives the pods no GPU, but [gpus] procs_per_gpu = 2"),
    ("per-proc-no-gpus", "[run]\ncommand = 'x'\n[gpus]\nper_proc = 1\n[k8s]\nimage = 'i'\ngpus_per_pod = 0\n",
     loc(7), "gives the pods no GPU"),
    ("gpus-not-multiple", "[run]\ncommand = 'x'\n[cluster]\nprocs_per_host = 2\n[gpus]\nper_proc = 2\n"
                          "[k8s]\nimage = 'i'\ngpus_per_pod = 5\n", loc(9), "not a multiple of [gpus] per_proc = 2"),
    ("gpus-do-not-fit", "[run]\ncommand = 'x'\n[cluster]\nprocs_per_host = 4\n[gpus]\nper_proc = 2\n"
                        "[k8s]\nimage = 'i'\ngpus_per_pod = 4\n", loc(9), "does not fit 4 ranks per pod"),
    ("bad-quantity", "[run]\ncommand = 'x'\n[k8s]\nimage = 'i'\nmemory = '64GB'\n", loc(5),
     "not a Kubernetes quantity"),
    ("memory-number", "[run]\ncommand = 'x'\n[k8s]\nimage = 'i'\nmemory = 64\n", loc(5), "a number of bytes"),
    ("unknown-key", "[run]\ncommand = 'x'\n[k8s]\nimage = 'i'\ngpu_per_pod = 1\n", loc(5, 1),
     "did you mean 'gpus_per_pod'"),
    ("reserved-env", "[run]\ncommand = 'x'\n[k8s]\nimage = 'i'\nenv = { RANK = 1 }\n", loc(5),
     "set by mltrain"),
    ("selector-type", "[run]\ncommand = 'x'\n[k8s]\nimage = 'i'\nnode_selector = { gpu = true }\n", loc(5),
     "must be a string"),
    ("bad-namespace", "[run]\ncommand = 'x'\n[k8s]\nimage = 'i'\nnamespace = 'ML_Team'\n", loc(5),
     "not a Kubernetes namespace"),
    ("bad-name", "name = 'My_Job'\n[run]\ncommand = 'x'\n[k8s]\nimage = 'i'\n", loc(1),
     "not a Kubernetes name"),
    ("ps-mode", "[run]\ncommand = 'x'\n[comm]\nmode = 'ps'\n[k8s]\nimage = 'i'\n", loc(4),
     "cannot be exported"),
    ("uneven-hosts", "[run]\ncommand = 'x'\n[cluster]\nhosts = ['a:2', 'b:1']\n[k8s]\nimage = 'i'\n", loc(4),
     "puts 2, 1 ranks"),
    ("nprocs-uneven", "[run]\ncommand = 'x'\n[cluster]\nnprocs = 5\n[k8s]\nimage = 'i'\nnodes = 2\n", loc(4),
     "does not split evenly"),
]


@pytest.mark.parametrize("to", ["volcano", "pytorchjob"])
@pytest.mark.parametrize("spec,where,text", [pytest.param(*c[1:], id=c[0]) for c in ERROR_CASES])
def test_spec_error(ml, to, spec, where, text):
    ml.write("job.toml", spec)
    r = export(ml, to)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    first = r.stderr.splitlines()[0]
    assert re.match(rf"mltrain: error: {where}: ", first), first
    assert text in first, first


def test_name_from_the_file_name(ml):
    ml.write("my_job.toml", "[run]\ncommand = 'x'\n[k8s]\nimage = 'i'\n")
    r = export(ml, "volcano", "my_job.toml")
    assert r.returncode == 2
    assert "my_job.toml: the job's name (from the file name): 'my_job' is not a Kubernetes name" in r.stderr
    assert 'set name = "my-job"' in r.stderr


def test_no_k8s_table(ml):
    ml.write("job.toml", "[run]\ncommand = 'x'\n")
    r = export(ml, "volcano")
    assert r.returncode == 2
    assert r.stderr.startswith("mltrain: error: job.toml: no [k8s] table")


@pytest.mark.parametrize("args,text", [
    (["--to", "volcanoo", "job.toml"], "--to 'volcanoo' is not an export target (did you mean 'volcano'?)"),
    (["--to", "pytorch", "job.toml"], "(did you mean 'pytorchjob'?)"),
    (["job.toml"], "--to is required"),
    (["--to", "volcano"], "needs a job spec"),
])
def test_usage_errors(ml, args, text):
    ml.write("job.toml", K8S_SPEC)
    r = ml("export", *args)
    assert r.returncode == 2, r.stdout
    assert r.stdout == ""
    assert text in r.stderr


def test_target_names_ignore_case(ml):
    ml.write("job.toml", K8S_SPEC)
    doc, _ = manifest(ml, "PyTorchJob")
    assert doc["kind"] == "PyTorchJob"


def test_help_has_examples(ml):
    r = ml("export", "--help")
    assert r.returncode == 0
    assert "mltrain export --to volcano job.toml | kubectl apply -f -" in r.stdout
