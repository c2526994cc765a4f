"""The work `invoke provision` does on a benchmark host (venv and weights left out), as a pyinfra
deploy: facts for a preflight gate, the service user and directories, the environment file and unit
(the same bytes as the tool renders, from bench_files), a daemon reload when the unit changed, the
service enabled and running."""
from pathlib import Path

from pyinfra import host
from pyinfra.facts.hardware import Memory
from pyinfra.facts.server import Command, KernelVersion
from pyinfra.operations import files, server, systemd

rendered = Path(host.data.bench_files) / host.data.name

# Facts for the gate; the GPU, driver and CPU topology ones come from their commands.
kernel = host.get_fact(KernelVersion)
memory_mib = host.get_fact(Memory)
gpus = host.get_fact(Command, "nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version,"
                              "pcie.link.gen.max --format=csv,noheader 2>/dev/null || true; "
                              "cat /proc/driver/nvidia/version 2>/dev/null || true; "
                              "lscpu -p=CPU,CORE,SOCKET,NODE,CACHE 2>/dev/null || true")
assert tuple(int(p) for p in kernel.split("-")[0].split(".")[:2]) >= (5, 10), f"kernel {kernel} too old"
assert memory_mib >= 1024, "too little memory"

server.user(name="Service user", user="vllm", system=True, home="/var/lib/vllm", ensure_home=False,
            shell="/usr/sbin/nologin")
for path, owner, mode in (("/etc/vllm", "root", "755"), ("/var/lib/vllm", "vllm", "750"),
                          ("/var/lib/vllm/hf", "vllm", "750"), ("/var/lib/vllm/models", "vllm", "750")):
    files.directory(name=f"Directory {path}", path=path, user=owner, group=owner, mode=mode)
env = files.put(name="Service environment", src=str(rendered / "vllm.env"), dest="/etc/vllm/vllm.env",
                user="root", group="root", mode="600")
unit = files.put(name="Unit", src=str(rendered / "vllm.service"), dest="/etc/systemd/system/vllm.service",
                 user="root", group="root", mode="644")
systemd.daemon_reload(name="Reload systemd", _if=unit.did_change)
systemd.service(name="Service enabled and running", service="vllm.service", running=True, enabled=True)
