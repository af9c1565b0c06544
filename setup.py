"""Package discovery: every folder with an `__init__.py` under the four roots below is installed, none by hand.

DESIGN §2 keeps `policies/`, `trainers/` and `search_spaces/` at the top level; they install as `tune_dfrl.<name>`.
Everything else about the project is in pyproject.toml."""

from setuptools import find_packages, setup

ROOTS = {
    "tune_dfrl": "tune_dfrl",
    "tune_dfrl.policies": "policies",
    "tune_dfrl.trainers": "trainers",
    "tune_dfrl.search_spaces": "search_spaces",
}
PACKAGES = [f"{name}.{sub}" if sub else name for name, folder in ROOTS.items() for sub in ["", *find_packages(folder)]]

setup(packages=PACKAGES, package_dir=ROOTS)
