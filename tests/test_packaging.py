"""A plain, non-editable install must carry the templates, migrations and the shipped catalog."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_holds_templates_migrations_and_catalog(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in (ROOT / "templates").rglob("*.j2"):
        assert "autogen/templates/" + template.relative_to(ROOT / "templates").as_posix() in names
    assert "tuning_db/migrations/versions/0001_initial.py" in names
    assert "tuning_db/migrations/script.py.mako" in names
    assert any(n.startswith("autogen/data/pretuned_") and n.endswith(".json") for n in names)
    assert not any(n.startswith("tests/") for n in names)
