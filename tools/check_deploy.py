"""Checks deploy/ beyond the Kubernetes schemas: that the manifests agree with each other and with
voxbatch's configuration (the KEDA objects have no schema in kubernetes-validate, so their fields
are checked here).

    .venv/bin/python tools/check_deploy.py [DEPLOY_DIR]

Exits 1 with one line per problem. Run by scripts/validate-deploy.sh (and so by `make test`).
"""
import pathlib
import re
import sys
import tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent


def seconds(duration: str) -> float:
    """A humantime duration as config/default.toml writes them: 250ms, 5s, 2m, 1h."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*", duration)
    if not m:
        raise ValueError(f"unreadable duration {duration!r}")
    return float(m.group(1)) * units[m.group(2)]


def main() -> int:
    deploy = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "deploy"
    k8s = deploy / "kubernetes"
    docs = {}
    for path in sorted(k8s.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs[(doc["kind"], doc["metadata"]["name"] if "metadata" in doc else path.name)] = doc
    problems = []

    def need(cond: bool, what: str) -> None:
        if not cond:
            problems.append(what)

    defaults = tomllib.loads((ROOT / "config/default.toml").read_text())
    config = tomllib.loads(docs[("ConfigMap", "voxbatch-config")]["data"]["voxbatch.toml"])
    merged = {s: {**defaults.get(s, {}), **config.get(s, {})} for s in defaults}
    unknown = [f"{s}.{k}" for s, keys in config.items() for k in keys if s not in defaults or k not in defaults[s]]
    need(not unknown, f"configmap: keys config/default.toml does not have: {unknown}")

    deployment = docs[("Deployment", "voxbatch-worker")]
    pod = deployment["spec"]["template"]["spec"]
    worker = pod["containers"][0]
    grace = pod.get("terminationGracePeriodSeconds", 30)
    max_hold = seconds(merged["worker"]["max_hold"])
    need(grace > max_hold, f"deployment: terminationGracePeriodSeconds {grace} must outlast worker.max_hold ({max_hold:.0f} s)")
    need(worker["resources"]["limits"].get("nvidia.com/gpu") == 1, "deployment: one GPU per worker (limits nvidia.com/gpu: 1)")
    need(pod["securityContext"].get("runAsNonRoot") is True, "deployment: runAsNonRoot")
    listen = merged["metrics"]["listen"]
    port = next((p["containerPort"] for p in worker.get("ports", []) if p["name"] == "metrics"), None)
    need(listen != "off" and listen.endswith(f":{port}") and not listen.startswith("127."),
         f"deployment: metrics.listen {listen!r} must serve the probes' port {port} beyond loopback")
    secret = docs[("Secret", "voxbatch-credentials")]
    refs = [e["secretRef"]["name"] for e in worker.get("envFrom", []) if "secretRef" in e]
    need(refs == [secret["metadata"]["name"]], f"deployment: credentials from Secret {secret['metadata']['name']}, got {refs}")
    for key in secret["stringData"]:
        need(key in {"AMQP_URL", "DATABASE_URL", "S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"},
             f"secret: {key} is not a variable voxbatch reads")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in worker["volumeMounts"]}
    need(volumes["config"]["configMap"]["name"] == "voxbatch-config", "deployment: config volume from ConfigMap voxbatch-config")
    args = worker["args"]
    need(args[:2] == ["--config", f"{mounts['config']}/voxbatch.toml"], f"deployment: --config must name the mounted file, got {args[:2]}")
    need(merged["model"]["dir"].startswith(mounts["models"] + "/"), f"configmap: model.dir {merged['model']['dir']} is not under the models mount {mounts['models']}")

    scaled = docs[("ScaledObject", "voxbatch-worker")]
    need(scaled["apiVersion"] == "keda.sh/v1alpha1", "scaledobject: apiVersion keda.sh/v1alpha1")
    need(scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"], "scaledobject: scaleTargetRef names the worker Deployment")
    triggers = scaled["spec"]["triggers"]
    need(len(triggers) == 1 and triggers[0]["type"] == "rabbitmq", "scaledobject: one rabbitmq trigger")
    meta = triggers[0]["metadata"]
    need(meta.get("queueName") == merged["amqp"]["queue"], f"scaledobject: queueName {meta.get('queueName')} is not amqp.queue {merged['amqp']['queue']}")
    need(meta.get("mode") in {"QueueLength", "MessageRate"} and str(meta.get("value", "")).isdigit(), "scaledobject: mode QueueLength/MessageRate with a numeric value")
    need(0 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"], "scaledobject: min ≤ max replicas")
    auth_name = triggers[0]["authenticationRef"]["name"]
    auth = docs.get(("TriggerAuthentication", auth_name))
    need(auth is not None, f"scaledobject: TriggerAuthentication {auth_name} missing")
    if auth:
        ref = auth["spec"]["secretTargetRef"][0]
        need(ref["parameter"] == "host" and ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"],
             "triggerauthentication: host from the credentials Secret's broker URL")

    kustom = yaml.safe_load((k8s / "kustomization.yaml").read_text())
    need("secret.example.yaml" not in kustom["resources"], "kustomization: the example Secret must not be applied")
    for r in kustom["resources"]:
        need((k8s / r).exists(), f"kustomization: {r} missing")

    for p in problems:
        print(f"check_deploy: {p}")
    if not problems:
        print(f"check_deploy: {len(docs)} objects agree with each other and with config/default.toml")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
