"""Secrets: read from a 0600 file or the environment, refused when others may read them, masked."""
from __future__ import annotations

from pathlib import Path

import pytest

from provision import secrets
from provision.errors import InventoryError


def test_a_private_file_is_read_and_its_values_masked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    path = tmp_path / "secrets.yaml"
    path.write_text("hf_token: hf_abcdefghijklmnop\napi_key: key-0123456789\n")
    path.chmod(0o600)
    held = secrets.load(str(path))
    assert held.hf_token == "hf_abcdefghijklmnop" and held.api_key == "key-0123456789"
    assert "hf_abc" not in repr(held)
    assert secrets.mask("token=hf_abcdefghijklmnop") == f"token={secrets.MASK}"


@pytest.mark.parametrize("mode, text, message", [
    (0o644, "hf_token: hf_x1234567\n", "mode 0644: others may read it; run `chmod 600"),
    (0o600, "hf_tokn: hf_x1234567\n", "unknown secret(s) hf_tokn"),
    (0o600, "hf_token: [a, b]\n", "'hf_token' must be a one-line string"),
    (0o600, "hf_token: 'hf_secret_value\n", "cannot read the secrets file near line"),
    (0o600, "mpi_ssh_key: not-a-key\n", "'mpi_ssh_key' must be an OpenSSH private key"),
])
def test_bad_secrets_files_are_refused_without_quoting_them(tmp_path: Path, mode: int, text: str,
                                                            message: str) -> None:
    path = tmp_path / "secrets.yaml"
    path.write_text(text)
    path.chmod(mode)
    with pytest.raises(InventoryError) as caught:
        secrets.load(str(path))
    assert message in str(caught.value) and "hf_secret_value" not in str(caught.value)


def test_without_a_file_the_environment_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_from_environment")
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    held = secrets.load(None)
    assert held.hf_token == "hf_from_environment" and held.api_key is None
    with pytest.raises(InventoryError, match="does not exist"):
        secrets.load("/nonexistent/secrets.yaml")


def test_the_environment_wins_over_the_file_per_secret_and_the_source_is_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secrets.yaml"
    path.write_text("hf_token: hf_from_the_file_123\napi_key: key-from-the-file-123\n")
    path.chmod(0o600)
    monkeypatch.setenv("HF_TOKEN", "hf_from_environment_456")
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    held = secrets.load(str(path))
    assert held.hf_token == "hf_from_environment_456" and held.api_key == "key-from-the-file-123"
    said = held.describe() or ""
    assert said == f"hf_token from the environment (HF_TOKEN); api_key from the secrets file {path}"
    assert "hf_from" not in said and "key-from" not in said
    # The file is still checked while the environment overrides it: a readable file is refused.
    path.chmod(0o644)
    with pytest.raises(InventoryError, match="others may read it"):
        secrets.load(str(path))


def test_every_secret_is_hidden_in_the_generations_a_host_keeps() -> None:
    """Generations store the managed files with each secret replaced by a placeholder: the MPI key file
    of a TensorRT-LLM head is one of them, so every secret must be among those replaced."""
    import dataclasses

    from provision import run
    from provision.host import generations

    held = secrets.Secrets(hf_token="hf_x" * 4, api_key="key-" * 4,
                           mpi_ssh_key="-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
                                       "-----END OPENSSH PRIVATE KEY-----")
    names = [f.name for f in dataclasses.fields(held) if f.name != "sources"]
    values = run.secret_environment(held)
    assert sorted(v for v in values.values() if v) == sorted(getattr(held, name) for name in names)
    kept = generations._hide_secrets((held.mpi_ssh_key or "").encode() + b"\n", values)
    assert b"PRIVATE KEY" not in kept and kept == b"@@secret:MPI_SSH_KEY@@\n"


def test_an_mpi_key_is_read_as_a_block_and_each_of_its_lines_masked(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROVISION_MPI_SSH_KEY", raising=False)
    body = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW"
    path = tmp_path / "secrets.yaml"
    path.write_text(f"mpi_ssh_key: |\n  -----BEGIN OPENSSH PRIVATE KEY-----\n  {body}\n"
                    "  -----END OPENSSH PRIVATE KEY-----\n")
    path.chmod(0o600)
    held = secrets.load(str(path))
    assert held.mpi_ssh_key is not None and body in held.mpi_ssh_key and "mpi_ssh_key=set" in repr(held)
    assert body not in secrets.mask(f"a log line quoting {body} by mistake")


def test_the_old_name_of_the_api_key_is_read_with_one_line_naming_the_new(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    path = tmp_path / "secrets.yaml"
    path.write_text("vllm_api_key: key-0123456789\n")
    path.chmod(0o600)
    with caplog.at_level("WARNING", logger="provision.secrets"):
        held = secrets.load(str(path))
    assert held.api_key == "key-0123456789"
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [f"{path}: vllm_api_key is deprecated: write api_key (read as api_key this time)"]
    path.write_text("vllm_api_key: key-0123456789\napi_key: key-9876543210\n")
    with pytest.raises(InventoryError, match="vllm_api_key is the old name of api_key, which is given too"):
        secrets.load(str(path))
