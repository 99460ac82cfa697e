"""What a workload is: its cases, its data set-up, and one repetition for one tool."""

from __future__ import annotations

from typing import Optional

from ..context import Case, Context
from ..tools import Tool
from ..util import Settled


class Workload:
    name = "?"          # id used on the command line and in file names
    number = 0          # position in the summary (1..6, as in the issue)
    title = "?"
    what = ""           # one paragraph for the summary / README: what it measures
    chart_metric = "seconds"   # or "throughput"

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.p = ctx.profile
        self.facts: dict = {}   # sizes of the generated data, measured at set-up, for the summary
        self._cases: Optional[list[Case]] = None

    def make_cases(self) -> list[Case]:
        raise NotImplementedError

    def cases(self) -> list[Case]:
        if self._cases is None:
            self._cases = self.make_cases()
        return self._cases

    def case(self, cid: str) -> Case:
        for c in self.cases():
            if c.id == cid:
                return c
        raise KeyError(cid)

    def applies_to(self, tool: Tool) -> bool:
        """FUSE tools always; a reference tool only when some case uses it."""
        return tool.kind == "fuse" or any(tool.kind in (c.ref, c.ref2) for c in self.cases())

    def setup(self) -> None:
        raise NotImplementedError

    def run(self, tool: Tool, rep: int) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        pass

    def close(self) -> None:
        """Stops whatever the workload started that outlives a run (a server of its own),
        whatever happened; called at the end of the bench run, after every unmount. Must be
        safe to call more than once and after a failed set-up."""

    # helpers ----------------------------------------------------------------------------------

    def unsupported_writes(self, tool: Tool, rep: int, cases: list[str]) -> bool:
        """Records the write cases as unsupported when the tool cannot write; True if so."""
        reason = self.ctx.write_support(tool)
        if reason is None:
            return False
        status = "unsupported" if reason.startswith("not supported") else "failed"
        for cid in cases:
            self.ctx.record(self.name, self.case(cid), tool, rep, status, error=reason)
        return True

    def measure(self, cid: str, tool: Tool, rep: int, cmd: str, **kw) -> dict:
        return self.ctx.measure(self.name, self.case(cid), tool, rep, cmd, **kw)

    def settle_exact(self, bucket: str, prefix: str, objects: int, nbytes: Optional[int]):
        def settle(deadline: float) -> Settled:
            return self.ctx.s3.wait_for(bucket, prefix, objects=objects, nbytes=nbytes,
                                        deadline=deadline)
        return settle
