"""Secrets during a full lab deploy: the HF token (a gated model is fetched with it) and the vLLM API
key (the server listens on every address) are found only in the 0600 environment file: not in any
process's command line, the journal, the tool's output or log, or any other file on the host."""
from __future__ import annotations

import json
import os
import secrets as random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provision import inventory, lab
from tests.conftest import REPO
from tests.lab.conftest import on_host

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("restores_lab_cpu")]

SCAN = r'''
import json, os, stat, sys
wanted = json.loads(sys.stdin.readline())
found = {"cmdline": [], "files": [], "journal": 0}
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            data = open("/proc/%s/cmdline" % pid, "rb").read()
        except OSError:
            continue
        if any(w.encode() in data for w in wanted):
            found["cmdline"].append(data.replace(b"\0", b" ").decode("utf-8", "replace")[:200])
for top in ("/etc", "/var", "/opt", "/root", "/srv", "/tmp", "/run", "/home", "/usr/local"):
    for root, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
        for name in files:
            path = os.path.join(root, name)
            try:
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode):
                    continue
                with open(path, "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            if any(w.encode() in data for w in wanted):
                found["files"].append([path, "%04o" % stat.S_IMODE(info.st_mode), info.st_uid])
import subprocess
journal = subprocess.run(["journalctl", "--no-pager", "-o", "cat"], stdout=subprocess.PIPE).stdout
found["journal"] = sum(journal.count(w.encode()) for w in wanted)
print(json.dumps(found))
'''


def invoke(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=1200, env=env, check=False)


def test_secrets_are_only_in_the_0600_environment_file(the_lab: lab.Lab, tmp_path: Path) -> None:
    token = yaml.safe_load(the_lab.secrets_file.read_text())["hf_token"]
    api_key = "sk-lab-" + random.token_hex(16)
    document = yaml.safe_load(the_lab.inventory.read_text())
    document["clusters"] = {"lab-cpu": {**document["clusters"]["lab-cpu"]}}
    document.pop("endpoints", None)  # of clusters this inventory leaves out
    document["clusters"]["lab-cpu"]["vars"] = {**document["clusters"]["lab-cpu"]["vars"],
                                               "model": "lab/gated-llama", "bind_host": "0.0.0.0"}
    secrets_file = tmp_path / "secrets.yaml"
    secrets_file.write_text(f"hf_token: {token}\n")
    secrets_file.chmod(0o600)
    document["secrets"] = str(secrets_file)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    log = tmp_path / "provision.log"
    env = {**os.environ, "PROVISION_LOG": str(log)}
    env.pop("HF_TOKEN", None)
    env.pop("VLLM_API_KEY", None)

    refused = invoke("check", "--inventory", str(path), "--cluster", "lab-cpu", "--json", env=env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    # The document, not the table: a table's cell wraps wherever its columns' widths fall.
    gate = {f["id"]: f for f in json.loads(refused.stdout)["hosts"]["cpu-1"]["findings"]}["config.api_key"]
    assert gate["status"] == "fail" and "would listen on 0.0.0.0 without an API key" in gate["message"], gate

    secrets_file.write_text(f"hf_token: {token}\napi_key: {api_key}\n")
    done = invoke("deploy", "--inventory", str(path), "--cluster", "lab-cpu", "--verbose", "--timeout", "420",
                  env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    inv = inventory.load(path)
    found = json.loads(on_host(inv, "cpu-1", ["python3", "-c", SCAN], stdin=json.dumps([token, api_key]) + "\n"))
    assert found["cmdline"] == [] and found["journal"] == 0, found
    assert found["files"] == [["/etc/vllm/vllm.env", "0600", 0]], found["files"]
    for text in (done.stdout, done.stderr, log.read_text()):
        assert token not in text and api_key not in text
    assert "cpu-1: env LC_ALL=C LANG=C python3 - -> exit 0" in log.read_text()  # the log was written
    probe = ("import json, sys, urllib.request, urllib.error\nkey = sys.stdin.readline().strip()\n"
             "def get(headers):\n    try:\n        return urllib.request.urlopen(urllib.request.Request("
             "'http://127.0.0.1:8000/v1/models', headers=headers), timeout=10).status\n"
             "    except urllib.error.HTTPError as exc:\n        return exc.code\n"
             "print(json.dumps([get({}), get({'Authorization': 'Bearer ' + key})]))\n")
    statuses = json.loads(on_host(inv, "cpu-1", ["python3", "-c", probe], stdin=api_key + "\n"))
    assert statuses == [401, 200]  # the key is what vLLM checks


def test_a_token_given_as_a_server_flag_is_refused_and_the_one_from_the_secrets_file_is_in_no_argv(
        the_lab: lab.Lab, tmp_path: Path) -> None:
    """vLLM's --hf-token in the cluster's server_flags, in extra_args or by --set: the installed command
    refuses each (exit 2, the secrets file's hf_token named) before it touches the host. The same token
    given in the secrets file deploys a gated model, and no process's /proc/PID/cmdline on the host nor
    the world-readable unit holds it."""
    command = shutil.which("provision")
    assert command is not None, "the `provision` console script is not installed"
    token = yaml.safe_load(the_lab.secrets_file.read_text())["hf_token"]
    api_key = "sk-lab-" + random.token_hex(16)
    document = yaml.safe_load(the_lab.inventory.read_text())
    document["clusters"] = {"lab-cpu": {**document["clusters"]["lab-cpu"]}}
    document.pop("endpoints", None)  # of clusters this inventory leaves out
    served = {**document["clusters"]["lab-cpu"]["vars"], "model": "lab/gated-llama"}
    secrets_file = tmp_path / "secrets.yaml"
    secrets_file.write_text(f"hf_token: {token}\napi_key: {api_key}\n")
    secrets_file.chmod(0o600)
    document["secrets"] = str(secrets_file)
    env = {key: value for key, value in os.environ.items() if key not in ("HF_TOKEN", "VLLM_API_KEY")}
    path = tmp_path / "inventory.yaml"

    def provision(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([command, *args], cwd=tmp_path, capture_output=True, text=True, timeout=1200,
                              env=env, check=False)

    extra = list(served.get("extra_args") or [])
    for carried, args in (({"server_flags": {"--hf-token": token}}, ()),
                          ({"extra_args": [*extra, "--hf-token", token]}, ()),
                          ({}, ("--set", f"server_flags={{--hf-token: {token}}}"))):
        document["clusters"]["lab-cpu"]["vars"] = {**served, **carried}
        path.write_text(yaml.safe_dump(document))
        refused = provision("deploy", "--inventory", str(path), "--cluster", "lab-cpu", *args)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "give it as the secrets file's hf_token" in refused.stderr
        assert token not in refused.stdout + refused.stderr

    document["clusters"]["lab-cpu"]["vars"] = served
    path.write_text(yaml.safe_dump(document))
    done = provision("deploy", "--inventory", str(path), "--cluster", "lab-cpu", "--timeout", "420")
    assert done.returncode == 0, done.stdout + done.stderr
    inv = inventory.load(path)
    found = json.loads(on_host(inv, "cpu-1", ["python3", "-c", SCAN], stdin=json.dumps([token]) + "\n"))
    assert found["cmdline"] == [], found["cmdline"]
    # The server needs no hub token (the tool fetched the weights): no file of the host holds it but
    # root's 0600 ones, never the 0644 unit.
    assert all(mode == "0600" and owner == 0 for _, mode, owner in found["files"]), found["files"]
    assert not [path for path, _, _ in found["files"] if path.endswith(".service")], found["files"]
    assert token not in done.stdout + done.stderr
