"""The container and cluster files of `hllm serve`: deploy/install-serve.sh installs a server without torch into a
fresh virtual environment; the Dockerfile uses it, runs as a non-root user, checks /readyz and reads the keys
from a mounted secret; the deploy/k8s manifests are valid Kubernetes objects (kubernetes-validate's offline
schemas, strict) and agree with each other and with the options of `hllm serve`."""

from __future__ import annotations

import os
import subprocess
import venv

import pytest

from tests.conftest import REPO

K8S = REPO / "deploy" / "k8s"


def _serve_options() -> set[str]:
    """Every option name of `hllm serve` (from the Typer app, as the command line parses them)."""
    import typer.main

    from hllm.cli.app import app
    import hllm.cli  # noqa: F401 — registers the commands

    cmd = typer.main.get_command(app).commands["serve"]
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}


def _check_args(args: list[str]) -> None:
    known = _serve_options()
    unknown = [a for a in args if a.startswith("--") and a not in known]
    assert not unknown, f"not options of hllm serve: {unknown}"
    assert "--api-key-file" in args and "--no-auth" not in args


def _docs(name: str) -> list[dict]:
    yaml = pytest.importorskip("yaml")
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def _validate(doc: dict) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e '.[dev]')")
    kv.validate(doc, kv.latest_version(), strict=True)


def test_kubernetes_manifests_are_valid_and_consistent():
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e '.[dev]')")
    (dep,), (svc,), (secret,) = _docs("deployment.yaml"), _docs("service.yaml"), _docs("secret.yaml")
    for doc in (dep, svc, secret):
        _validate(doc)
    broken = {**svc, "spec": {**svc["spec"], "portz": []}}  # the validator does catch an unknown field
    with pytest.raises(kv.ValidationError):
        _validate(broken)
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["model"]["readOnly"] is True and volumes["model"]["persistentVolumeClaim"]["readOnly"] is True
    assert c["args"][0] == mounts["model"]["mountPath"]
    assert volumes["api-keys"]["secret"]["secretName"] == secret["metadata"]["name"]
    key_file = c["args"][c["args"].index("--api-key-file") + 1]
    assert key_file == f"{mounts['api-keys']['mountPath']}/{next(iter(secret['stringData']))}"
    _check_args(c["args"])
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"] == dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["ports"][0]["targetPort"] == c["ports"][0]["name"]
    graceful = float(c["args"][c["args"].index("--graceful-timeout") + 1])
    assert graceful < pod["terminationGracePeriodSeconds"]


def test_kserve_inference_service_speaks_v2_with_a_valid_container():
    """The InferenceService (a CRD: no schema offline) has KServe's v1beta1 shape; its predictor's container and
    volumes, put in a Pod, are valid Kubernetes."""
    (isvc,) = _docs("inferenceservice.yaml")
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    pred = isvc["spec"]["predictor"]
    assert set(pred) <= {"minReplicas", "maxReplicas", "containers", "volumes", "serviceAccountName", "scaleTarget",
                         "scaleMetric", "timeout", "containerConcurrency", "nodeSelector", "tolerations"}
    _validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "predictor"},
               "spec": {"containers": pred["containers"], "volumes": pred["volumes"]}})
    (c,) = pred["containers"]
    assert c["name"] == "kserve-container"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    _check_args(c["args"])
    from hllm.serve.auth import OPEN_PATHS

    assert {c["readinessProbe"]["httpGet"]["path"], c["livenessProbe"]["httpGet"]["path"]} <= OPEN_PATHS


def test_dockerfile_serves_without_torch_as_a_non_root_user():
    text = (REPO / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.replace("\\\n", " ").splitlines() if ln.strip() and not ln.startswith("#")]
    run = [ln for ln in lines if ln.startswith("RUN ")]
    assert len(run) == 1 and "deploy/install-serve.sh" in run[0]  # the one install step is the tested script
    assert "ARG EXTRAS=runtime,serve" in lines and "torch" not in text.replace("no torch", "")
    user = next(ln for ln in lines if ln.startswith("USER ")).split()[1]
    assert user.isdigit() and int(user) > 0
    health = next(ln for ln in lines if ln.startswith("HEALTHCHECK "))
    assert "/readyz" in health
    import json

    entry = json.loads(next(ln for ln in lines if ln.startswith("ENTRYPOINT "))[len("ENTRYPOINT "):])
    cmd = json.loads(next(ln for ln in lines if ln.startswith("CMD "))[len("CMD "):])
    assert entry == ["hllm", "serve"]
    _check_args(cmd)
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ignored[0] == "*" and "!deploy/install-serve.sh" in ignored


def test_install_script_in_a_fresh_venv_serves_without_torch(tmp_path):
    """deploy/install-serve.sh (the Dockerfile's install step) into an empty venv: `hllm serve` is there,
    torch and transformers are not (about 30 s from pip's cache; bounded at 10 minutes)."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    r = subprocess.run(["sh", str(REPO / "deploy" / "install-serve.sh"), str(REPO)], env={**os.environ, "PYTHON": str(py)},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    listed = subprocess.run([str(py), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, timeout=120).stdout
    names = {ln.split("==")[0].lower() for ln in listed.splitlines()}
    assert {"hllm", "onnxruntime", "fastapi", "uvicorn"} <= names and not {"torch", "transformers"} & names, names
    r = subprocess.run([str(py), "-m", "hllm", "serve", str(REPO), "--host", "0.0.0.0"], capture_output=True, text=True,
                       timeout=120, env={k: v for k, v in os.environ.items() if k != "HLLM_API_KEYS"})
    assert r.returncode == 2 and "no API key" in " ".join(r.stderr.split()), r.stderr[-2000:]
