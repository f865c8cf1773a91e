"""A whole SnapStream cluster as local processes (``snapstream up``, end-to-end tests): a Redis
or NATS JetStream server, one prefill worker, decode workers and the router.

```python
from cluster import ClusterSpec, LocalCluster

with LocalCluster(ClusterSpec(store="nats", router_port=0)) as cluster:
    router_address = cluster.endpoints["router"]
```
"""

from cluster.plan import SERVICE_NAMES, Member, plan_cluster
from cluster.spec import ClusterSpec
from cluster.stores import STORE_SERVERS, StoreServer
from cluster.supervisor import ClusterError, LocalCluster

__all__ = [
    "SERVICE_NAMES",
    "STORE_SERVERS",
    "ClusterError",
    "ClusterSpec",
    "LocalCluster",
    "Member",
    "StoreServer",
    "plan_cluster",
]
