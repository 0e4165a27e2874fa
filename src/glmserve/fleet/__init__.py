"""Scale-out: several SGLang workers behind SGLang's own router (sglang-router, PyPI).

Stdlib only, like the launcher: the router image and the compose generator run it without the
tools' dependencies. See docs/fleet.md.
"""
