"""The two environment rules: what tool children lose, what the daemon itself keeps."""

from __future__ import annotations

from magi_code.tools.environment import child_environment, daemon_environment

STARTER = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/u",
    "USER": "u",
    "LOGNAME": "u",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "TMPDIR": "/tmp/u",
    "XDG_RUNTIME_DIR": "/run/user/1000",
    "MC_HOME": "/home/u/.magi-code",
    "MC_RUNTIME_DIR": "/run/mc",
    "MC_DAEMON_IDLE_SECONDS": "5",
    "MC_DAEMON_NO_SCOPE": "1",
    "PYTHONPATH": "/src",
    "PYTHONUNBUFFERED": "1",
    # Everything below is the starter's business, never the daemon's.
    "ANTHROPIC_API_KEY": "sk-ant-0000",
    "OPENAI_API_KEY": "sk-oai-0000",
    "MY_PROVIDER_API_KEY": "sk-custom-0000",
    "GITHUB_TOKEN": "ghp_0000",
    "CLIENT_SECRET": "s3cr3t",
    "AWS_ACCESS_KEY_ID": "AKIA0000",
    "AWS_SECRET_ACCESS_KEY": "aws-0000",
    "HTTPS_PROXY": "http://user:pass@proxy:3128",
    "https_proxy": "http://user:pass@proxy:3128",
    "ALL_PROXY": "socks5://user:pass@proxy:1080",
    "MC_CODEX_BASE_URL": "http://127.0.0.1:1/v1",
    "MC_PROVIDER": "local",
    "MC_MODEL": "m1",
    "MC_SERVICE_MODE": "daemon",
    "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",
    "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/1000/bus",
    "TERM": "xterm",
    "SHELL": "/bin/bash",
    "VIRTUAL_ENV": "/venv",
}


def test_the_daemon_keeps_only_its_allow_list() -> None:
    assert daemon_environment(STARTER) == {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/u",
        "USER": "u",
        "LOGNAME": "u",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "TMPDIR": "/tmp/u",
        "XDG_RUNTIME_DIR": "/run/user/1000",
        "MC_HOME": "/home/u/.magi-code",
        "MC_RUNTIME_DIR": "/run/mc",
        "MC_DAEMON_IDLE_SECONDS": "5",
        "MC_DAEMON_NO_SCOPE": "1",
        "PYTHONPATH": "/src",
        "PYTHONUNBUFFERED": "1",
    }


def test_the_daemon_allow_list_is_idempotent_and_never_keeps_credential_shapes() -> None:
    clean = daemon_environment(STARTER)
    assert daemon_environment(clean) == clean
    for name in clean:
        assert not name.endswith(("_KEY", "_TOKEN", "_SECRET", "_PROXY", "_proxy"))
        assert not name.startswith(("AWS_", "ANTHROPIC_", "OPENAI_", "MC_CODEX_"))
    assert "user:pass" not in repr(clean) and "sk-" not in repr(clean)


def test_children_keep_the_launch_environment_minus_service_and_credential_variables() -> None:
    child = child_environment(STARTER, secret_names={"MY_PROVIDER_API_KEY"})
    for gone in (
        "MC_HOME",
        "MC_RUNTIME_DIR",
        "MC_DAEMON_IDLE_SECONDS",
        "MC_SERVICE_MODE",
        "MC_CODEX_BASE_URL",
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "MY_PROVIDER_API_KEY",
    ):
        assert gone not in child
    # A developer's own tools still see their environment (it is theirs, not the daemon's).
    assert child["GITHUB_TOKEN"] == "ghp_0000"
    assert child["TERM"] == "xterm"
    assert child["MC_PROVIDER"] == "local"
