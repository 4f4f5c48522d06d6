"""The evaluation grid: which lengths are in-distribution and which are held out.

Few-shot probes and full-grid fits only ever see in-distribution cells (prompt lengths up to
2048 tokens, answers up to 64 tokens); the held-out cells (longer prompts or longer answers)
test extrapolation, as SimFLi's Table 4 does with its second token range.
"""

import dataclasses
from typing import Tuple

from timebill_ros.checks import check_lengths


@dataclasses.dataclass(frozen=True)
class GridDesign:
    """Prompt lengths (n_in) and answer lengths (n_out), tokens, split ID / held-out.

    Held-out lengths must all lie above the in-distribution ones. probe_n_out: the answer
    lengths few-shot probes draw from (a subset of id_n_out; short, because every answer
    token costs a decoding step of profiling time).
    """

    id_n_in: Tuple[int, ...] = (16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048)
    heldout_n_in: Tuple[int, ...] = (2560, 3072, 4096)
    id_n_out: Tuple[int, ...] = (8, 16, 32, 64)
    heldout_n_out: Tuple[int, ...] = (128, 192)
    probe_n_out: Tuple[int, ...] = (8, 16, 32)

    def __post_init__(self):
        """Check the lengths, naming the bad field."""
        for name in ('id_n_in', 'heldout_n_in', 'id_n_out', 'heldout_n_out', 'probe_n_out'):
            object.__setattr__(self, name, check_lengths(name, getattr(self, name)))
        if self.heldout_n_in[0] <= self.id_n_in[-1]:
            raise ValueError('heldout_n_in must lie above id_n_in')
        if self.heldout_n_out[0] <= self.id_n_out[-1]:
            raise ValueError('heldout_n_out must lie above id_n_out')
        if not set(self.probe_n_out) <= set(self.id_n_out):
            raise ValueError(f'probe_n_out {self.probe_n_out} must be a subset of id_n_out')

    @property
    def n_in_values(self):
        """Every prompt length to measure, tokens."""
        return self.id_n_in + self.heldout_n_in

    @property
    def n_out_values(self):
        """Every answer length read from the runs, tokens."""
        return self.id_n_out + self.heldout_n_out

    @property
    def n_out_max(self):
        """Tokens each measured run decodes."""
        return self.n_out_values[-1]

    def cells(self, split):
        """Return the (n_in, n_out) cells of ``split``: ``id``, ``heldout`` or ``all``."""
        every = [(i, o) for i in self.n_in_values for o in self.n_out_values]
        if split == 'all':
            return every
        inside = [(i, o) for i, o in every if i in self.id_n_in and o in self.id_n_out]
        if split == 'id':
            return inside
        if split == 'heldout':
            return [cell for cell in every if cell not in inside]
        raise ValueError(f"split must be 'id', 'heldout' or 'all', got {split!r}")
