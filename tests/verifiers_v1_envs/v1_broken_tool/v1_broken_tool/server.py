"""The tool server of ``v1_broken_tool``: its one tool fails on every call, the way a
tool server whose backing service refuses it (a 401, a dead database) does."""

import verifiers.v1 as vf


class VaultToolset(vf.Toolset[vf.ToolsetConfig, vf.State]):
    TOOL_PREFIX = "vault"

    @vf.tool
    def read(self, key: str) -> str:
        """Return the value stored under a key."""
        raise RuntimeError(f"vault refused the read of {key!r}: 401 Unauthorized")


if __name__ == "__main__":
    VaultToolset.run()
