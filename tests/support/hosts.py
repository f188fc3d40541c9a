"""What a run's hosts (infra.services.hosts) left on this machine: namespaces, links, rules.

The tests of ``--hosts`` assert with these that nothing of a run outlives its cleanup:
``ip netns list`` and ``ip link`` name nothing carrying the run's id, and
``iptables-save`` in the root namespace holds no rule of the nemesis.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from infra.faults.nemesis import CHAIN
from infra.services.hosts import HOSTS_FILE, LINK_PREFIX, NETNS_PREFIX, HostsError, require_netns


def _hosts_refused() -> str:
    try:
        require_netns()
    except HostsError as exc:
        return str(exc)
    return ""


#: Why this machine cannot make hosts (root and ``ip netns``); "" when it can.
HOSTS_REFUSED = _hosts_refused()


def run_id(run_dir: Path) -> str:
    """The id a run directory's hosts carry in their names."""
    return str(json.loads((run_dir / HOSTS_FILE).read_text())["run_id"])


def leftovers(run: str) -> list[str]:
    """Namespaces and links of run ``run`` that exist now, and root rules of the nemesis."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                           check=True, timeout=20).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                           check=True, timeout=20).stdout
    found = [f"netns {line.split()[0]}" for line in netns.splitlines()
             if line.startswith(f"{NETNS_PREFIX}{run}-")]
    found += [f"link {line.split(':')[1].strip().split('@')[0]}" for line in links.splitlines()
              if line.split(":")[1].strip().startswith(f"{LINK_PREFIX}{run}-")]
    if shutil.which("iptables-save"):
        rules = subprocess.run(["iptables-save"], capture_output=True, text=True,
                               check=False, timeout=20).stdout
        found += [f"rule {line}" for line in rules.splitlines() if CHAIN in line]
    return found
