"""The workload groups, in summary order: the six of issue 3, fio's job shapes (issue 18), then
reads from each tool's data cache on local disk."""

from .cached_reads import CachedReads
from .fio_reads import FioReads
from .fuse_overhead import FuseOverhead
from .large_files import LargeFiles
from .metadata import Metadata
from .random_reads import RandomReads
from .small_files import SmallFiles
from .tree import Tree

ALL = [LargeFiles, Tree, RandomReads, SmallFiles, Metadata, FuseOverhead, FioReads, CachedReads]
BY_NAME = {w.name: w for w in ALL}
