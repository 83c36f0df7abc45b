"""What a simulated run records as it goes: the engine samples (`SampleRecorder`, thinned to a
bounded count) and every request's streamed chunks (`ChunkStore`, two flat columns). The
simulator's event loop (simulator.py) and its steady steps (steady.py) both write to them.
"""

from __future__ import annotations

import numpy as np

from labs.backends.base import Chunks, EngineSample

# A sample's columns: t_s, running, waiting, blocks used, tokens scheduled.
_COLUMNS = 5


class SampleRecorder:
    """Engine samples, one per step until `max_samples`; then neighbours are merged pairwise and
    each sample stands for twice as many steps. Steps come in one at a time (`add`) or as arrays
    for a run of skipped steps (`add_many`); they are folded into the samples every few thousand
    steps, so memory stays bounded however long the run.

    NOTE: a merged sample holds the earlier time and the maxima of running, waiting, KV usage
    and tokens scheduled over the steps it stands for (like an oscilloscope's peak detect), so
    the peaks that `max_running_seqs` and `kv_usage_peak` read, and a token budget reached in any
    of its steps, survive thinning exactly.
    """

    _FOLD_EVERY = 8192

    def __init__(self, max_samples: int, num_blocks: int) -> None:
        self.max_samples = max(2, max_samples + max_samples % 2)  # even: merged in pairs
        self.num_blocks = num_blocks
        self._stride = 1
        # Folded samples, columns t_s, running, waiting, blocks used, tokens scheduled (all
        # exact in float64).
        self._samples = np.empty((0, _COLUMNS))
        self._raw: list[np.ndarray] = []  # steps not folded yet, in order
        self._row: list[tuple[float, int, int, int, int]] = []
        self._num_raw = 0

    def add(self, t_s: float, running: int, waiting: int, blocks_used: int, tokens: int) -> None:
        self._row.append((t_s, running, waiting, blocks_used, tokens))
        self._num_raw += 1
        if self._num_raw >= self._FOLD_EVERY:
            self._fold()

    def add_many(
        self,
        t_s: np.ndarray,
        running: int | np.ndarray,
        waiting: int | np.ndarray,
        blocks_used: np.ndarray,
        tokens: int | np.ndarray,
    ) -> None:
        self._flush_rows()
        block = np.empty((len(t_s), _COLUMNS))
        block[:, 0], block[:, 1], block[:, 2], block[:, 3] = t_s, running, waiting, blocks_used
        block[:, 4] = tokens
        self._raw.append(block)
        self._num_raw += len(t_s)
        if self._num_raw >= self._FOLD_EVERY:
            self._fold()

    def _flush_rows(self) -> None:
        if self._row:
            self._raw.append(np.array(self._row, dtype=np.float64))
            self._row = []

    @staticmethod
    def _peak(rows: np.ndarray, stride: int) -> np.ndarray:
        """Merge every `stride` consecutive rows: the first time, the maxima of the rest."""
        groups = rows.reshape(-1, stride, _COLUMNS)
        merged = groups.max(axis=1)
        merged[:, 0] = groups[:, 0, 0]
        return merged

    def _fold(self, final: bool = False) -> None:
        self._flush_rows()
        raw = np.concatenate(self._raw) if self._raw else np.empty((0, _COLUMNS))
        samples, stride, top = self._samples, self._stride, self.max_samples
        while True:
            complete = len(raw) // stride
            if len(samples) + complete < top:
                break
            # Fill up to max_samples at this stride, then halve the count and double the stride.
            take = top - len(samples)
            samples = np.concatenate([samples, self._peak(raw[: take * stride], stride)])
            raw = raw[take * stride :]
            samples = self._peak(samples, 2)
            stride *= 2
        complete = len(raw) // stride
        samples = np.concatenate([samples, self._peak(raw[: complete * stride], stride)])
        raw = raw[complete * stride :]
        if final and len(raw):
            samples = np.concatenate([samples, self._peak(raw, len(raw))])
            raw = raw[:0]
        self._samples, self._stride = samples, stride
        self._raw = [raw] if len(raw) else []
        self._num_raw = len(raw)

    def finish(self) -> list[EngineSample]:
        self._fold(final=True)
        rows = self._samples
        return [
            EngineSample(
                t_s=t,
                running=r,
                waiting=w,
                kv_usage=b / self.num_blocks,
                kv_blocks_used=b,
                scheduled_tokens=n,
            )
            for t, r, w, b, n in zip(
                rows[:, 0].tolist(),
                rows[:, 1].astype(np.int64).tolist(),
                rows[:, 2].astype(np.int64).tolist(),
                rows[:, 3].astype(np.int64).tolist(),
                rows[:, 4].astype(np.int64).tolist(),
                strict=True,
            )
        ]


class ChunkStore:
    """Every request's streamed chunks, written in place into two flat columns (times, tokens):
    request i owns a slice as long as its output (a chunk holds at least one token), and has
    used `num_chunks[i]` of it."""

    def __init__(self, num_output_tokens: np.ndarray) -> None:
        self.start = np.cumsum(num_output_tokens) - num_output_tokens
        total = int(num_output_tokens.sum())
        self.times_s = np.empty(total, dtype=np.float64)
        self.tokens = np.empty(total, dtype=np.int32)
        self.num_chunks = np.zeros(len(num_output_tokens), dtype=np.int64)

    def add(self, t_s: float, idx: np.ndarray, tokens: np.ndarray) -> None:
        place = self.start[idx] + self.num_chunks[idx]
        self.times_s[place] = t_s
        self.tokens[place] = tokens
        self.num_chunks[idx] += 1

    def add_steps(self, t_s: np.ndarray, idx: np.ndarray, tokens: np.ndarray | None = None) -> None:
        """A chunk for each of `idx` at each of the times `t_s`: tokens[step, i] tokens (one
        when not given)."""
        place = (self.start[idx] + self.num_chunks[idx])[None, :] + np.arange(len(t_s))[:, None]
        self.times_s[place] = t_s[:, None]
        self.tokens[place] = 1 if tokens is None else tokens
        self.num_chunks[idx] += len(t_s)

    def add_runs(
        self, idx: np.ndarray, end_s: np.ndarray, first: np.ndarray, last: np.ndarray
    ) -> None:
        """One token for request idx[j] at each of end_s[first[j]..last[j]] (distinct requests)."""
        lengths = last - first + 1
        owners = np.repeat(idx, lengths)
        within = np.arange(len(owners)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        place = self.start[owners] + self.num_chunks[owners] + within
        self.times_s[place] = end_s[np.repeat(first, lengths) + within]
        self.tokens[place] = 1
        self.num_chunks[idx] += lengths

    def all_chunks(self) -> list[Chunks]:
        """Each request's chunks, as views of the flat columns."""
        times, tokens, of = self.times_s, self.tokens, Chunks.of_columns
        return [
            of(times[a : a + n], tokens[a : a + n])
            for a, n in zip(self.start.tolist(), self.num_chunks.tolist(), strict=True)
        ]
