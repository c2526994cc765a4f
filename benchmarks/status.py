"""What `invoke status` reads on a host, as one program (Ansible and pyinfra run it in one session,
as `python3 -c SOURCE`): the unit, the GPUs, memory, and the server's /health, /v1/models and
/metrics twice, 1 s apart. Runs on the host's python3 (3.6 or later), standard library only."""
import http.client
import json
import subprocess
import sys
import time
import urllib.request

UNIT = ["systemctl", "show", "vllm.service", "-p", "ActiveState,SubState,NRestarts,ActiveEnterTimestamp"]
GPUS = ["nvidia-smi", "--query-gpu=name,memory.used,memory.total,temperature.gpu,utilization.gpu",
        "--format=csv,noheader,nounits"]
SERVER = "http://127.0.0.1:8000"


def run(argv, stderr=None):
    """The command's exit code, its output printed as it came; 127 when it is not installed."""
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=stderr, check=False)
    except FileNotFoundError:
        return 127
    sys.stdout.write(done.stdout.decode(errors="replace"))
    return done.returncode


def get(path):
    """(HTTP status, body), or (None, the error) when the server does not answer."""
    try:
        with urllib.request.urlopen(SERVER + path, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except (OSError, http.client.HTTPException, ValueError) as exc:  # refused, timed out, HTTP 503...
        return None, str(exc)


def main():
    run(UNIT)
    if run(GPUS, stderr=subprocess.DEVNULL) != 0:
        print("no nvidia-smi")
    with open("/proc/meminfo") as meminfo:
        sys.stdout.write("".join(line for line in meminfo if line.startswith(("MemTotal:", "MemAvailable:"))))
    sys.stdout.flush()
    health, models, metrics = get("/health")[0], get("/v1/models")[1], [get("/metrics")[1]]
    time.sleep(1)
    metrics.append(get("/metrics")[1])
    print(json.dumps({"health": health, "models": models, "metrics_bytes": [len(m) for m in metrics]}))


if __name__ == "__main__":
    main()
