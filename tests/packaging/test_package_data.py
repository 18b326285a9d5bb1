"""What an installed ninfer (a wheel, the Nix package) holds besides Python code: the dashboard page and the
llama-ui pin. Both ship as files of the package (scikit-build-core's `wheel.packages` copies every file under
python/ninfer that git does not ignore; the Nix package builds from the same tree), so they must be found inside the
package, never through the checkout around it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from ninfer.serve import webui_bundle
print(json.dumps({"dashboard": str(webui_bundle.DASHBOARD_DIR), "pin": webui_bundle.PIN}))
"""


def test_dashboard_and_pin_resolve_inside_a_package_without_the_checkout(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    tracked = subprocess.run(["git", "ls-files", "python/ninfer"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    for name in tracked:  # the package as the wheel lays it out, far from any checkout
        target = site / Path(name).relative_to("python")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / name, target)
    # -S: no site-packages, so no editable install can send `ninfer` back to the checkout.
    probe = subprocess.run([sys.executable, "-S", "-c", _PROBE, str(site)], cwd=tmp_path, capture_output=True,
                           text=True, check=True)
    found = json.loads(probe.stdout)
    dashboard = Path(found["dashboard"])
    assert dashboard.is_relative_to(site), found
    assert {"index.html", "dashboard.js", "dashboard.css"} <= {p.name for p in dashboard.iterdir()}
    assert found["pin"] == json.loads((REPO / "python/ninfer/serve/webui/pin.json").read_text())
