"""This machine's peak arithmetic throughput and memory bandwidth, measured with torch.

The roofline predictor needs PK (FLOP/s) and BW (bytes/s). Neither is published for a shared
VM or a Jetson in its current power mode, so both are measured: the best of a few timed
square matrix products (FLOP/s) and tensor copies (bytes read + written per second), on the
engine's device, dtype and thread count.
"""

import dataclasses
import time

import torch

from timebill_ros.checks import check_nonneg_real
from timebill_ros.engine.forward import synchronize


@dataclasses.dataclass(frozen=True)
class Hardware:
    """peak_flops: FLOP/s. bandwidth_bps: bytes/s. measure_s: seconds the measurement took."""

    peak_flops: float
    bandwidth_bps: float
    measure_s: float = 0.0

    def __post_init__(self):
        """Check both rates are > 0."""
        for name in ('peak_flops', 'bandwidth_bps'):
            if check_nonneg_real(name, getattr(self, name)) <= 0:
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)!r}')


def _best_s(fn, device, repeats):
    """Return the fastest of ``repeats`` timed calls of ``fn`` (seconds), after one warm-up."""
    fn()
    best = float('inf')
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def measure_hardware(device='cpu', dtype=torch.float32, matmul_n=1024, copy_mb=256,
                     repeats=5):
    """Measure peak FLOP/s (n x n matmul, 2 n^3 FLOP) and copy bandwidth; return Hardware."""
    device = torch.device(device)
    start = time.perf_counter()
    a = torch.randn(matmul_n, matmul_n, device=device, dtype=dtype)
    b = torch.randn(matmul_n, matmul_n, device=device, dtype=dtype)
    flops = 2.0 * matmul_n ** 3 / _best_s(lambda: torch.mm(a, b), device, repeats)
    elements = copy_mb * 2 ** 20 // torch.empty((), dtype=dtype).element_size()
    src = torch.ones(elements, device=device, dtype=dtype)
    dst = torch.empty_like(src)
    moved = 2.0 * src.numel() * src.element_size()  # read + write
    bandwidth = moved / _best_s(lambda: dst.copy_(src), device, repeats)
    return Hardware(flops, bandwidth, time.perf_counter() - start)
