"""Developer tooling of the rlsync repository: the pin, the patch series and
its overlay, and applying the series to an SGLang tree.

Not shipped: it works on this repository's files (`pins/<version>/`: the pin,
its series and overlay; `common/`). `make` drives it; `python -m devtools --help`
lists the commands.
Standard library and git only.
"""
