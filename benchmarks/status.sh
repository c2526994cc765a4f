# What `invoke status` reads on a host, as one script (Ansible and pyinfra run it in one session):
# the unit, the GPUs, memory, and the server's /health, /v1/models and /metrics twice, 1 s apart.
systemctl show vllm.service -p ActiveState,SubState,NRestarts,ActiveEnterTimestamp
nvidia-smi --query-gpu=name,memory.used,memory.total,temperature.gpu,utilization.gpu --format=csv,noheader,nounits 2>/dev/null || echo "no nvidia-smi"
grep -E '^(MemTotal|MemAvailable):' /proc/meminfo
python3 -c '
import json, time, urllib.request
def get(path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:8000" + path, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except Exception as exc:
        return None, str(exc)
out = {"health": get("/health")[0], "models": get("/v1/models")[1], "metrics": [get("/metrics")[1]]}
time.sleep(1)
out["metrics"].append(get("/metrics")[1])
print(json.dumps({"health": out["health"], "models": out["models"], "metrics_bytes": [len(m) for m in out["metrics"]]}))
'
