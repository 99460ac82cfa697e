"""The workload groups, in summary order: the six of issue 3, fio's job shapes (issue 18),
reads from each tool's data cache on local disk, readers and writers against a throttled store
(issue 32), real programs in a fresh mount (issue 49), then many readers at once (issue 52)."""

from .cached_reads import CachedReads
from .fio_reads import FioReads
from .fuse_overhead import FuseOverhead
from .large_files import LargeFiles
from .many_readers import ManyReaders
from .metadata import Metadata
from .programs import Programs
from .random_reads import RandomReads
from .small_files import SmallFiles
from .throttled import Throttled
from .tree import Tree

ALL = [LargeFiles, Tree, RandomReads, SmallFiles, Metadata, FuseOverhead, FioReads, CachedReads,
       Throttled, Programs, ManyReaders]
BY_NAME = {w.name: w for w in ALL}
