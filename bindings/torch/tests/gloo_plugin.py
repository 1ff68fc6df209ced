"""gloo registered again under the name "glooplug", as a plugin backend:
dist_suite.py's plugin path (--import gloo_plugin --backend glooplug) can be
checked without Loom, and what gloo passes and the plugin does not is then
what the suite does differently for a plugin, not a backend's fault.

SPDX-License-Identifier: Apache-2.0
"""

import torch.distributed as dist


def _create(store, rank, size, timeout):
    return dist.ProcessGroupGloo(store, rank, size, timeout)


if not hasattr(dist.Backend, "GLOOPLUG"):
    dist.Backend.register_backend("glooplug", _create, devices=["cpu"])
