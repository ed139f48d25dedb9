"""A replica's newest timings and their percentiles, for the live figures of /v1/stats. Pure."""

from __future__ import annotations

from collections import deque


class RecentTimings:
    """The newest `keep` samples: Prometheus keeps the full histograms, this answers "how fast now"."""

    def __init__(self, keep: int = 1000):
        self._samples: deque[float] = deque(maxlen=keep)

    def add(self, ms: float) -> None:
        self._samples.append(ms)

    def __len__(self) -> int:
        return len(self._samples)

    def percentile(self, q: float) -> float | None:
        """Nearest-rank percentile (0 < q <= 100) of the samples kept; None without any."""
        if not self._samples:
            return None
        ordered = sorted(self._samples)
        rank = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 100)) - 1))
        return round(ordered[rank], 3)
