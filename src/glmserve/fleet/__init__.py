"""Scale-out: several SGLang workers behind the Shepherd Model Gateway (smg, PyPI; the maintained
successor of SGLang's sglang-router).

Stdlib only, like the launcher: the router image and the compose generator run it without the
tools' dependencies. See docs/fleet.md.
"""
