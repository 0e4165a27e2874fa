"""Launcher: a launch profile (data) plus inputs -> validated argv list -> exec SGLang.

Stdlib only: it runs inside the SGLang image, where nothing may be added to SGLang's environment.
See docs/launch.md for the inputs, the profiles and every refusal.
"""

from glmserve.launch.cli import build_plan, main, run
from glmserve.launch.errors import LaunchError
from glmserve.launch.host import Host
from glmserve.launch.inventory import Gpu
from glmserve.launch.profiles import Profile, load_profile, parse_profile_file

__all__ = [
    "Gpu",
    "Host",
    "LaunchError",
    "Profile",
    "build_plan",
    "load_profile",
    "main",
    "parse_profile_file",
    "run",
]
