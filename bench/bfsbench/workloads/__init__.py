"""The six workload groups of issue 3, in summary order."""

from .fuse_overhead import FuseOverhead
from .large_files import LargeFiles
from .metadata import Metadata
from .random_reads import RandomReads
from .small_files import SmallFiles
from .tree import Tree

ALL = [LargeFiles, Tree, RandomReads, SmallFiles, Metadata, FuseOverhead]
BY_NAME = {w.name: w for w in ALL}
