#!/usr/bin/python3
"""docs/DEPLOY.md's examples must work as written: the systemd unit passes `systemd-analyze verify`, the
Kubernetes manifests parse and carry what probes and gateways need, and every `mxserve` flag they pass is
one `mxserve serve --help` lists. Usage: deploy_doc_test.py DEPLOY.md MXSERVE_BINARY"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml


def blocks(text, lang):
    return re.findall(r"```" + lang + r"\n(.*?)```", text, re.S)


def serve_flags(binary):
    out = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True, check=True).stdout
    flags = set(re.findall(r"^\s+--([a-z0-9-]+)", out, re.M))
    for also in re.findall(r"\(also ([^)]*)\)", out):
        flags.update(a.strip().lstrip("-") for a in also.split(","))
    return flags


def check_flags(args, known, where):
    assert args and args[0] == "serve", f"{where}: the command must be `serve`, got {args[:1]}"
    for a in args[1:]:
        if a.startswith("--"):
            name = a[2:].split("=", 1)[0]
            assert name in known, f"{where}: `mxserve serve` has no flag --{name}"


def check_unit(unit, binary, known):
    exec_line = re.search(r"^ExecStart=(\S+) (.*)$", unit, re.M)
    assert exec_line, "the unit has no ExecStart"
    check_flags(exec_line.group(2).split(), known, "systemd ExecStart")
    assert re.search(r"^TimeoutStopSec=(\d+)$", unit, re.M), "TimeoutStopSec must cover the drain"
    stop = int(re.search(r"^TimeoutStopSec=(\d+)$", unit, re.M).group(1))
    drain = int(re.search(r"--shutdown-timeout (\d+)", unit).group(1))
    assert stop > drain, f"TimeoutStopSec {stop} must exceed --shutdown-timeout {drain}"
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        print("systemd-analyze not found: unit syntax not verified")
        return
    with tempfile.TemporaryDirectory() as d:
        # The unit as installed, pointing at the built binary and an existing environment file.
        env = os.path.join(d, "env")
        open(env, "w").write("MXSERVE_API_KEY=k\n")
        text = unit.replace("/usr/local/bin/mxserve", binary).replace("/etc/mxserve/env", env)
        path = os.path.join(d, "mxserve.service")
        open(path, "w").write(text)
        r = subprocess.run([analyze, "verify", path], capture_output=True, text=True)
        # The unit's own problems name a line of it (or say it is bad); complaints about the machine (no
        # systemd running in a container) do not.
        problems = [l for l in (r.stdout + r.stderr).splitlines()
                    if re.search(r"mxserve\.service:\d+:", l) or "bad unit file setting" in l or "fatal error" in l]
        assert not problems, "systemd-analyze verify: " + "; ".join(problems)


def check_manifests(text, known):
    docs = [d for d in yaml.safe_load_all(text) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert set(by_kind) >= {"Deployment", "Service", "InferencePool"}, sorted(by_kind)
    dep = by_kind["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (c,) = pod["containers"]
    check_flags(c["args"], known, "Deployment args")
    args = c["args"]
    port = int(args[args.index("--port") + 1])
    assert {"containerPort": port, "name": "http"} in c["ports"], "the http port must match --port"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health", probe
    drain = int(args[args.index("--shutdown-timeout") + 1])
    assert pod["terminationGracePeriodSeconds"] > drain, "the grace period must cover the drain"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    if "--kv-events-endpoint" in args:
        kv_port = int(args[args.index("--kv-events-endpoint") + 1].rsplit(":", 1)[1])
        assert any(p["containerPort"] == kv_port for p in c["ports"]), "expose the KV events port"
        page = int(args[args.index("--page-size") + 1])
        assert page == 64, "llm-d reads 64-token blocks: --page-size 64"
    pool = by_kind["InferencePool"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pool["spec"]["targetPorts"] == [{"number": port}]
    assert pool["spec"]["endpointPickerRef"]["name"] and pool["spec"]["endpointPickerRef"]["port"]["number"]
    svc = by_kind["Service"]
    assert svc["spec"]["selector"].items() <= labels.items()


def main():
    doc, binary = sys.argv[1], os.path.abspath(sys.argv[2])
    text = open(doc).read()
    known = serve_flags(binary)
    units, manifests = blocks(text, "ini"), blocks(text, "yaml")
    assert len(units) == 1 and len(manifests) == 1, "DEPLOY.md holds one unit and one manifest block"
    check_unit(units[0], binary, known)
    check_manifests(manifests[0], known)
    print("DEPLOY.md: unit and manifests check out")


if __name__ == "__main__":
    main()
