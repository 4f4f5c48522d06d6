"""Frozen configuration dataclasses: one per parameter group.

A ROS parameter ``<group>.<field>`` (e.g. ``budget.alpha_max``) maps to the field of the same
name in the dataclass of that group. Units are in the field names or docstrings.
Validation lives in ``__post_init__`` and raises ``ValueError`` naming the bad value.
"""

import dataclasses
import math

from timebill_ros.checks import (check_choice, check_count, check_int, check_nonneg_real,
                                 check_positive)
from timebill_ros.plugins import NAMES as PLUGINS  # the plugin families' names

WEIGHT_FORMATS = ('float32', 'float16', 'bfloat16')
# Formats of the one-token steps' weights: the model formats and weight-only int8.
DECODE_FORMATS = ('auto',) + WEIGHT_FORMATS + ('int8', 'gguf')
FORWARDS = ('auto', 'lean', 'transformers')
BUDGET_MODES = ('timebill', 'fixed')
PREFILL_DTYPES = ('auto', 'float32', 'bfloat16')
PREDICTOR_PROVIDERS = ('auto', 'cpu', 'cuda')
OFFLOAD_DTYPES = ('auto',) + WEIGHT_FORMATS
# The OpenAI backend's two endpoints (engine.backend names are plugins.NAMES['backend']).
REMOTE_APIS = ('completions', 'chat')


STARTUP_METHODS = ('few_shot', 'grid')
UNCERTAINTY_SOURCES = ('predictor', 'none')


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """The LLM engine (group ``engine``).

    model_path: a GGUF file (``.gguf``: llama, qwen2, qwen3, gemma3 or phi3, served on its own
        blocks with its own tokenizer and chat template on the CPU, dequantized once into
        ``dtype`` on a GPU; docs/own_model.md, docs/gpu.md), or a transformers model
        directory; empty = the embedded SmolLM2-135M-Instruct Q4_1 GGUF, served like a
        ``.gguf`` path on the CPU in float32 and on a GPU with ``decode_weights`` auto or
        gguf, else converted once to a transformers directory (float16 on the CPU, a lean
        step format).
    model_cache_dir: where the converted embedded model is saved; empty = $TIMEBILL_CACHE,
        else ~/.cache/timebill_ros.
    device: torch device (``cpu``, ``cuda``, ``cuda:0``).
    dtype: ``float32``, ``float16`` or ``bfloat16``: the weights as loaded (and the prefill's).
    forward: ``auto`` (the lean Llama forward on a preallocated KV cache for Llama-family
        models, transformers' modules for every other), ``lean`` or ``transformers``.
    decode_weights: the weight format of one-token decoding steps on the lean forward
        (``float32``, ``float16``, ``bfloat16``, ``int8`` weight-only with bf16 activations,
        ``gguf``: the embedded GGUF's own Q4_1 / Q8_0 blocks through the C++ kernels, fp32
        activations, or ``auto``); a format other than ``dtype`` keeps a copy of the linear
        weights in it. ``auto`` (default) times fp32, fp16 and (embedded model, fp32 on the
        CPU, kernels built) gguf steps at start-up and keeps the faster of the exact formats
        fp32 and gguf, unless fp16 is >= 10 % faster still (engine/step_format.py): all three
        answer like fp32 on held-out prompts, bf16 and int8 do not (docs/engine.md).
        With a ``.gguf`` model_path a dtype (``float32``, ``float16``, ``bfloat16``) serves it
        on the dense decoder (weights dequantized once into that dtype, what a GPU runs) on
        any device; on a GPU it must be ``auto`` or ``dtype``.
    prefill_dtype: a GGUF model's prefill GEMMs (more than 16 tokens): ``float32`` (the
        kernels' GEMM on the file's blocks: exact against gguf's dequantization, a token's
        logits the same whatever the chunk plan), ``bfloat16`` (torch's GEMM on a bf16 copy of
        each matrix, activations as two bf16 parts, fp32 sums; greedy answers as fp32's on
        held-out prompts, docs/own_model.md) or ``auto`` (float32 on a CPU without bf16 dot
        products, with no probe; on one with them, bfloat16 when a probe at load finds that
        path, dequantization included, >= 1.5x as fast as the fp32 GEMM on the blocks: it
        was 0.9-1.15x on an AMX Xeon). Decoding steps are fp32 either way. A transformers
        model prefills in ``dtype``: leave it ``auto``.
    threads: torch intra-op threads; 0 = torch's default.
    max_new_tokens: server default N_max, tokens: the N_max of a goal sent with
        max_new_tokens 0.
    max_model_new_tokens: N_model, the most tokens a goal may ask for, tokens; a goal asking
        for more is REJECTED.
    prefill_chunk_tokens: the largest prefill chunk, tokens; the server makes a goal's chunks
        smaller where the time model says one layer of a chunk would outlast stop_bound_s.
    feedback_every_tokens: publish action feedback every this many generated tokens.
    stop_bound_s: the longest cancel and Kill may wait for the model, seconds: they are
        checked before every decoder layer, and prefill chunks are sized so that one layer of
        a chunk takes at most this (WORST bound of the time model); 0 = one decoding step at
        the goal's prompt length.
    loop_guard: stop an answer whose last tokens repeat one cycle (finish_reason
        ``repetition``; the response keeps the text up to the end of the cycle's first copy);
        the embedded model loops on a third of the corpus prompts (docs/engine.md).
    loop_guard_max_period: the longest cycle the guard looks for, tokens.
    loop_guard_min_repeats: how many copies of a cycle make a loop (>= 2).
    loop_guard_min_span: the fewest tokens a loop spans (all its copies together): shorter
        repeats (a table rule, "- - -") are not loops.
    backend: ``local`` (the model runs in this process) or ``openai``: goals run on an
        existing serving engine (llama.cpp's server, vLLM, Triton's OpenAI front end) over
        its OpenAI-compatible HTTP API; ``model_path`` then gives only the tokenizer (N_x and
        the predictors run here), and there is no KV eviction: the budget decision is the
        request's ``max_tokens`` (docs/remote.md).
    remote_url: the engine's API base, e.g. ``http://127.0.0.1:8080/v1`` (backend openai).
    remote_model: the model name sent with each request; empty = the first id the
        server's ``/models`` lists.
    remote_api: ``completions`` (``/completions`` with the prompt as this tokenizer's chat
        template renders it: N_x is exact) or ``chat`` (``/chat/completions``: the server
        applies its own template; N_x is this tokenizer's count).
    remote_connect_timeout_s: the longest a connection to the engine may take, seconds.
    remote_idle_timeout_s: the longest the engine may stay silent during a request (its
        queueing and prefill included), seconds; Kill and Partial goals end at their
        deadline first.
    remote_context_tokens: the engine's context, tokens (prompt + answer); 0 = the
        tokenizer model's own context.
    remote_fallback: also load ``model_path`` here (calibrated at start-up as a local
        engine is) and run a goal on it when the remote engine is unreachable, busy (429 /
        503) or silent before its first token, if the local time model says it still fits
        its deadline (result ``executor: fallback``).
    step_buffers_mb: the most MB the dense decoder's static decoding buffers (a GGUF file on
        a GPU: the KV buckets its CUDA graphs replay on, engine/models/static_step.py) may
        hold; beyond it the least recently used bucket is given back (its goals keep copies
        of their KV); a step that needs one bucket larger than the cap still gets it. The
        one-row buckets up to 4096 tokens are made at load (SmolLM2-135M: 366 MB).
    """

    model_path: str = ''
    model_cache_dir: str = ''
    device: str = 'cpu'
    dtype: str = 'float32'
    forward: str = 'auto'
    decode_weights: str = 'auto'
    prefill_dtype: str = 'auto'
    threads: int = 0
    max_new_tokens: int = 256
    max_model_new_tokens: int = 2048
    prefill_chunk_tokens: int = 512
    feedback_every_tokens: int = 4
    stop_bound_s: float = 0.0
    loop_guard: bool = True
    loop_guard_max_period: int = 64
    loop_guard_min_repeats: int = 3
    loop_guard_min_span: int = 48
    backend: str = 'local'
    remote_url: str = ''
    remote_model: str = ''
    remote_api: str = 'completions'
    remote_connect_timeout_s: float = 2.0
    remote_idle_timeout_s: float = 30.0
    remote_context_tokens: int = 0
    remote_fallback: bool = False
    step_buffers_mb: float = 2048.0

    def __post_init__(self):
        check_choice('engine.dtype', self.dtype, WEIGHT_FORMATS)
        self._check_remote()
        if not isinstance(self.loop_guard, bool):
            raise TypeError(f'engine.loop_guard must be a bool, got {self.loop_guard!r}')
        for name in ('loop_guard_max_period', 'loop_guard_min_span'):
            check_count(f'engine.{name}', getattr(self, name))
        check_count('engine.loop_guard_min_repeats', self.loop_guard_min_repeats, minimum=2)
        check_choice('engine.forward', self.forward, FORWARDS)
        check_choice('engine.decode_weights', self.decode_weights, DECODE_FORMATS)
        check_choice('engine.prefill_dtype', self.prefill_dtype, PREFILL_DTYPES)
        check_nonneg_real('engine.stop_bound_s', self.stop_bound_s)
        check_positive('engine.step_buffers_mb', self.step_buffers_mb)
        self._check_device()
        if (not isinstance(self.threads, int) or isinstance(self.threads, bool)
                or self.threads < 0):
            raise ValueError(f'engine.threads must be an int >= 0, got {self.threads!r}')
        for name in ('max_new_tokens', 'max_model_new_tokens', 'prefill_chunk_tokens',
                     'feedback_every_tokens'):
            check_count(f'engine.{name}', getattr(self, name))
        if self.max_new_tokens > self.max_model_new_tokens:
            raise ValueError(
                f'engine.max_new_tokens ({self.max_new_tokens}) exceeds '
                f'engine.max_model_new_tokens ({self.max_model_new_tokens})')

    def _check_remote(self):
        """Check the remote backend's fields (ValueError / TypeError naming the value)."""
        check_choice('engine.backend', self.backend, PLUGINS['backend'])
        check_choice('engine.remote_api', self.remote_api, REMOTE_APIS)
        check_positive('engine.remote_connect_timeout_s', self.remote_connect_timeout_s)
        check_positive('engine.remote_idle_timeout_s', self.remote_idle_timeout_s)
        check_int('engine.remote_context_tokens', self.remote_context_tokens)
        if not isinstance(self.remote_fallback, bool):
            raise TypeError(f'engine.remote_fallback must be a bool, got '
                            f'{self.remote_fallback!r}')
        for name in ('remote_url', 'remote_model'):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f'engine.{name} must be a string, got '
                                f'{getattr(self, name)!r}')
        if self.backend == 'local':
            return
        if not self.remote_url.startswith(('http://', 'https://')):
            raise ValueError(f'engine.backend {self.backend} needs engine.remote_url, an '
                             'http(s) URL such as http://127.0.0.1:8080/v1; got '
                             f'{self.remote_url!r}')

    def _check_device(self):
        """Refuse a device that the chosen weight format cannot run on (ValueError).

        The GGUF kernels read host memory only: ``decode_weights: gguf`` runs on the CPU
        (engine/kernels). On a GPU a ``.gguf`` model_path (and the embedded model) is served
        by the same family decoder with its weights dequantized once into ``dtype``
        (engine/models): ``decode_weights`` must be ``auto`` (or ``dtype``) there.
        """
        if not isinstance(self.device, str) or not self.device:
            raise TypeError(f'engine.device must be a torch device name, got {self.device!r}')
        if self.device.split(':', 1)[0] == 'cpu':
            return
        if (self.model_path.lower().endswith('.gguf')
                and self.decode_weights not in ('auto', self.dtype)):
            raise ValueError(f'engine.device {self.device!r}: a .gguf model_path runs on the '
                             f'GPU in engine.dtype ({self.dtype}); decode_weights must be auto '
                             f'there, got {self.decode_weights!r}')
        if self.decode_weights == 'gguf':
            raise ValueError(f'engine.device {self.device!r}: decode_weights gguf runs on the '
                             'CPU kernels; use float32, float16 or auto on the GPU')


@dataclasses.dataclass(frozen=True)
class EvictionConfig:
    """KV-cache eviction (group ``eviction``).

    scorer: which kvpress scorer ranks prompt KV entries: snapkv, streaming_llm, knorm.
    window_size: observation window, tokens at the end of the prompt that are always kept
        (and, for SnapKV, whose attention scores the rest).
    """

    scorer: str = 'snapkv'
    window_size: int = 32

    def __post_init__(self):
        check_choice('eviction.scorer', self.scorer, PLUGINS['eviction scorer'])
        check_count('eviction.window_size', self.window_size)


@dataclasses.dataclass(frozen=True)
class PrefixCacheConfig:
    """Reuse of prompt KV a goal shares with earlier ones (group ``prefix_cache``).

    enabled: keep each goal's prompt KV (before its eviction) in a per-engine store; a goal
        whose templated prompt starts with stored tokens copies them and prefills only the
        rest, and its time estimates (admission, alpha*, t^_WCET, the scheduler) count that.
    max_mb: the most the store holds, MiB (KV of every layer plus pooled sums); the least
        recently used blocks go first, pinned ones never. SmolLM2-135M keeps 45 KiB a token
        in fp32 (a 3,600-token context: 162 MiB). The node's memory grows to it while the
        store fills (each new goal's unique tail adds blocks), so the default of 256 MiB
        (~5,800 tokens of SmolLM2) suits a robot's shared RAM; it was 1024.
    min_tokens: a shared head shorter than this is not reused, and prompts shorter than this
        are not stored, tokens.
    block_tokens: the store's granularity, tokens: prompts are matched and stored in whole
        blocks of this many tokens.
    pin: system prompts (texts) prefilled at start-up and never dropped: a goal sent with one
        of them as its ``system_prompt`` finds it cached from its first time on.
    """

    enabled: bool = True
    max_mb: float = 256.0
    min_tokens: int = 128
    block_tokens: int = 32
    pin: tuple = ()

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            raise TypeError(f'prefix_cache.enabled must be a bool, got {self.enabled!r}')
        check_nonneg_real('prefix_cache.max_mb', self.max_mb)
        check_int('prefix_cache.min_tokens', self.min_tokens)
        check_count('prefix_cache.block_tokens', self.block_tokens)
        if isinstance(self.pin, str) or not isinstance(self.pin, (list, tuple)):
            raise TypeError(f'prefix_cache.pin must be a list of strings, got {self.pin!r}')
        if any(not isinstance(text, str) or not text.strip() for text in self.pin):
            raise ValueError(f'prefix_cache.pin must hold non-empty strings, got {self.pin!r}')
        object.__setattr__(self, 'pin', tuple(self.pin))

    @property
    def max_bytes(self) -> int:
        """The bound in bytes."""
        return int(self.max_mb * 2 ** 20)


@dataclasses.dataclass(frozen=True)
class BudgetConfig:
    """TimeBill budget math (group ``budget``).

    pessimistic_factor: k >= 1 in N^_W = min(k N^, N_max).
    upper_quantile: q in [0, 1): 0 = TimeBill's N^_W = min(k N^, N_max); q > 0 = N^_W is the
        predictor's q-quantile of the length, min(N_max, max(N^, N^_q)), where the predictor
        has a length distribution (the RLP classifier), else k N^.
    alpha_max: largest KV eviction ratio, in [0, 1).
    mode: ``timebill`` (alpha* from Eq. 11) or ``fixed`` (always ``fixed_alpha``; baselines).
    fixed_alpha: the eviction ratio used when mode is ``fixed``, in [0, 1).
    expected_fallback: when no alpha <= alpha_max meets the WORST bound, choose alpha* for
        the EXPECTED bound instead of alpha_max (the promise is lost either way; evict only
        what the expected time needs, since each evicted token costs answer quality).
        false = the paper's rule (Eq. 10c clamps alpha* to alpha_max). For partial goals
        only, whose cut answer still arrives: kill and skip_next goals always take the clamp
        (their best chance to finish), since a late Kill answer is lost and a late Skip-Next
        one makes the goals after it skip.
    keep_cache_when_hopeless: when not even alpha_max fits (at the EXPECTED bound with the
        fallback, else at the decision bound), keep the whole cache (alpha 0) instead of
        alpha_max: the goal is predicted to miss whatever is evicted, so eviction buys no
        deadline and costs answer quality. false = the paper's clamp to alpha_max. For
        partial goals only (as expected_fallback): on robot contexts, kill goals that kept
        their cache at 0.3-0.6 of the Vanilla time all missed where alpha = 0.95 completed
        some, and skip_next goals that kept it ran late and skipped half the stream
        (docs/benchmark.md).
    checkpoint_tokens: m, tokens: with mode ``timebill``, 0 decides alpha* once after the
        prefill (the paper); m > 0 decides again every m tokens while the answer decodes,
        and between them where the prompt's bound on the answer's end moves later
        (timebill-online, timing/checkpoint.py): each decision is the smallest alpha for
        which m more tokens, then an eviction to alpha_max, then the rest of the length
        bound still fit the time left, and the bound of the rest is re-predicted from the
        length distribution given the tokens so far (docs/deadlines.md).
    """

    pessimistic_factor: float = 5.0
    upper_quantile: float = 0.9
    alpha_max: float = 0.95
    mode: str = 'timebill'
    fixed_alpha: float = 0.0
    expected_fallback: bool = True
    keep_cache_when_hopeless: bool = True
    checkpoint_tokens: int = 0

    def __post_init__(self):
        check_positive('budget.pessimistic_factor', self.pessimistic_factor)
        if not isinstance(self.checkpoint_tokens, int) or isinstance(
                self.checkpoint_tokens, bool) or self.checkpoint_tokens < 0:
            raise ValueError(f'budget.checkpoint_tokens must be an int >= 0, got '
                             f'{self.checkpoint_tokens!r}')
        if self.pessimistic_factor < 1:
            raise ValueError(
                f'budget.pessimistic_factor must be >= 1, got {self.pessimistic_factor!r}')
        for name in ('alpha_max', 'fixed_alpha', 'upper_quantile'):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f'budget.{name} must be in [0, 1), got {value!r}')
        check_choice('budget.mode', self.mode, BUDGET_MODES)


@dataclasses.dataclass(frozen=True)
class PredictorConfig:
    """Response-length predictor (group ``predictor``).

    kind: ``rlp`` (the trained RLP, ONNX, onnxruntime) or ``fallback`` (N^ = N_max). If the
        RLP file is missing or broken the server logs why and serves with the fallback.
    model_file: the RLP ONNX file; empty = the cache entry ``timebill predictor train
        --export`` writes for this model (``<cache>/rlp/<model>__rlp.onnx``).
    threads: onnxruntime intra-op threads of the predictor.
    provider: onnxruntime's execution provider: ``auto`` (default) and ``cpu`` run the
        predictor on the CPU (``CPUExecutionProvider``), also where onnxruntime-gpu sees a GPU:
        the GPU is busy with the prefill the predictor runs beside, and a small model's call
        there costs more in transfers than it gains; ``cuda`` asks for onnxruntime's CUDA
        provider (the CPU where it lacks it).
    min_input_tokens: lower clamp of N_p, the compressed predictor input, tokens.
    max_input_tokens: upper clamp of N_p, the compressed predictor input, tokens
        (>= min_input_tokens); an RLP file trained at a smaller N_p reads at most that.
    timeout_s: how long after prefill ends a goal waits for the predictor's answer, seconds;
        then it goes on with the fallback N^ and the result says so.
    prefill_readout: with ``kind`` rlp, read N^ (and N^_q) after the prefill from the goal's
        own pooled layer states (the readout head, ~0.1 ms) instead of running the RLP
        beside the prefill; the RLP then only gives the admission-time u_J. A missing or
        broken readout file: the server logs why and predicts with the RLP as before.
    readout_file: the readout ONNX file; empty = the cache entry ``timebill predictor readout
        --export`` writes (``<cache>/rlp/<model>__readout.onnx``).
    decode_readout: with the prefill readout and ``budget.checkpoint_tokens`` > 0, read the
        rest of the answer at each checkpoint from the prompt's and the answer's own states
        (the decode readout, ``timebill predictor decode-readout --export``) instead of the
        prefill readout's distribution alone; a missing or broken file: logged, not used.
        Off by default: on robot contexts it lowered timebill-online's score at 0.75 t_v by
        0.122 [0.058, 0.192] and changed no other budget beyond its interval
        (docs/benchmark.md).
    decode_readout_file: the decode readout ONNX file; empty = the cache entry
        (``<cache>/rlp/<model>__decode_readout.onnx``).
    reload_check_s: while the node serves without the RLP or the readout (their files did
        not exist when it was configured: ``make run`` builds them in the background), look
        for them every this many seconds; once they load, the node builds a service with them
        beside the running one and switches to it when no goal is queued or running, and logs
        so. 0 = never.
    """

    kind: str = 'rlp'
    model_file: str = ''
    threads: int = 1
    provider: str = 'auto'
    min_input_tokens: int = 64
    max_input_tokens: int = 2048
    timeout_s: float = 1.0
    prefill_readout: bool = True
    readout_file: str = ''
    decode_readout: bool = False
    decode_readout_file: str = ''
    reload_check_s: float = 10.0

    def __post_init__(self):
        check_choice('predictor.kind', self.kind, PLUGINS['length predictor'])
        if (isinstance(self.reload_check_s, bool)
                or not isinstance(self.reload_check_s, (int, float))
                or not 0 <= self.reload_check_s < float('inf')):
            raise ValueError(f'predictor.reload_check_s must be a number of seconds >= 0, '
                             f'got {self.reload_check_s!r}')
        for name in ('prefill_readout', 'decode_readout'):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f'predictor.{name} must be a bool, got '
                                f'{getattr(self, name)!r}')
        for name in ('model_file', 'readout_file', 'decode_readout_file'):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f'predictor.{name} must be a str, got {getattr(self, name)!r}')
        check_choice('predictor.provider', self.provider, PREDICTOR_PROVIDERS)
        for name in ('threads', 'min_input_tokens', 'max_input_tokens'):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f'predictor.{name} must be an int, got {value!r}')
            check_positive(f'predictor.{name}', value)
        if self.max_input_tokens < self.min_input_tokens:
            raise ValueError(
                f'predictor.max_input_tokens ({self.max_input_tokens!r}) must be >= '
                f'predictor.min_input_tokens ({self.min_input_tokens!r})')
        check_positive('predictor.timeout_s', self.timeout_s)


@dataclasses.dataclass(frozen=True)
class TimingConfig:
    """Execution-time estimator calibration (group ``timing``).

    calibration_file: YAML written by ``timebill profile``; empty = the per-user cache entry
        for this model/device/dtype/threads.
    calibrate_on_start: when no calibration exists, profile at start-up (bounded) and cache it.
    max_calibration_s: time bound of the start-up calibration, seconds.
    startup_method: how the start-up calibration measures: ``few_shot`` (five probes, Eq. 4
        fitted to them, ``timebill profile --few-shot``) or ``grid`` (the start-up grid,
        ``timebill profile --quick``).
    online: correct the time model online from every goal (speed factors and a residual
        margin, timing/online.py); false = the calibration as measured, no margin.
    speed_gain: weight of a goal that ran faster than assumed in a phase's speed factor, in
        (0, 1]; a slower goal sets the factor at once (a peak follower, timing/online.py).
    residual_window: goals whose residuals (measured / corrected estimate) are kept per phase.
    wcet_quantile: upper quantile of the residuals that t^_WCET uses (the WORST bound);
        admission and early Kill use 1 - it.
    decision_quantile: upper quantile of the residuals alpha* is solved at, in [0.5, 1]
        (the smaller of it and wcet_quantile is used). Below wcet_quantile: the length bound
        N^_W is already an upper quantile (budget.upper_quantile), and the speed factor a
        peak follower, so solving at the WORST residual too stacks three margins and evicts
        where the whole cache fits (docs/benchmark.md, robot contexts). t^_WCET stays at
        wcet_quantile.
    min_residuals: below this many residuals a phase also uses prior_margin.
    prior_margin: margin (>= 1) of a phase with too few residuals; least times use 1 / it.
    warm_up: at start-up run one synthetic goal (prefill, predictor, eviction, a few steps)
        to measure the machine's speed of the moment before serving.
    state_file: where the online state is saved and restored; empty = next to the cached
        calibration (``<cache>/calibration/<key>.online.yaml``).
    persist_period_s: save the online state at most this often (and at shutdown), seconds.
    """

    calibration_file: str = ''
    calibrate_on_start: bool = True
    max_calibration_s: float = 60.0
    startup_method: str = 'few_shot'
    online: bool = True
    speed_gain: float = 0.3
    residual_window: int = 64
    wcet_quantile: float = 0.99
    decision_quantile: float = 0.9
    min_residuals: int = 8
    prior_margin: float = 1.3
    warm_up: bool = True
    state_file: str = ''
    persist_period_s: float = 30.0

    def __post_init__(self):
        check_positive('timing.max_calibration_s', self.max_calibration_s)
        check_choice('timing.startup_method', self.startup_method, STARTUP_METHODS)
        check_positive('timing.persist_period_s', self.persist_period_s)
        self.online_settings()  # validates the online fields

    def online_settings(self):
        """Return the OnlineSettings of these parameters."""
        return OnlineSettings(
            enabled=self.online, speed_gain=self.speed_gain,
            residual_window=self.residual_window, wcet_quantile=self.wcet_quantile,
            decision_quantile=self.decision_quantile, min_residuals=self.min_residuals,
            prior_margin=self.prior_margin)


@dataclasses.dataclass(frozen=True)
class OnlineSettings:
    """How the model corrects itself (the ``timing`` parameters of the same names).

    enabled: False = the calibration as measured (no factor, no margin: the fixed model).
    speed_gain: weight of a goal that ran faster than assumed in a phase's speed factor, in
        (0, 1] (a slower goal sets it at once).
    residual_window: residuals kept per phase (goals).
    wcet_quantile: upper quantile of the residuals for WORST; 1 - it for LEAST.
    decision_quantile: upper quantile of the residuals for DECIDE (what alpha* is solved at);
        min(it, wcet_quantile) is used.
    min_residuals: below this many residuals the prior margin is used as well.
    prior_margin: upper margin (>= 1) before enough residuals; LEAST uses its inverse.
    """

    # Defaults: the ``timing`` parameters' (one home for them).
    enabled: bool = TimingConfig.online
    speed_gain: float = TimingConfig.speed_gain
    residual_window: int = TimingConfig.residual_window
    wcet_quantile: float = TimingConfig.wcet_quantile
    decision_quantile: float = TimingConfig.decision_quantile
    min_residuals: int = TimingConfig.min_residuals
    prior_margin: float = TimingConfig.prior_margin

    def __post_init__(self):
        """Check every field, naming the bad one."""
        if not 0 < self.speed_gain <= 1:
            raise ValueError(f'timing.speed_gain must be in (0, 1], got {self.speed_gain!r}')
        check_int('timing.residual_window', self.residual_window, 1)
        check_int('timing.min_residuals', self.min_residuals, 0)
        if not 0.5 <= self.wcet_quantile <= 1:
            raise ValueError(
                f'timing.wcet_quantile must be in [0.5, 1], got {self.wcet_quantile!r}')
        if not 0.5 <= self.decision_quantile <= 1:
            raise ValueError(f'timing.decision_quantile must be in [0.5, 1], got '
                             f'{self.decision_quantile!r}')
        if not math.isfinite(self.prior_margin) or self.prior_margin < 1:
            raise ValueError(f'timing.prior_margin must be >= 1, got {self.prior_margin!r}')


@dataclasses.dataclass(frozen=True)
class OverrunConfig:
    """Overrun policy (group ``overrun``): what a goal does at or past its deadline.

    default_policy: the overrun policy of a goal sent with ``POLICY_DEFAULT``: ``kill``
        (stop at the deadline, or as soon as it cannot finish, and discard the text),
        ``skip_next`` (finish late; goals that come due meanwhile end SKIPPED) or ``partial``
        (stop at the deadline and return the text so far).
    """

    default_policy: str = 'kill'

    def __post_init__(self):
        check_choice('overrun.default_policy', self.default_policy,
                     PLUGINS['overrun policy'])


@dataclasses.dataclass(frozen=True)
class AdmissionConfig:
    """Admission control (group ``admission``).

    policy: ``feasibility`` (a goal whose least possible time - prefill, predictor overhang,
        one decoding step, from the time model - exceeds the time left is REJECTED under
        Kill and Partial, at receipt and while queued; Skip-Next goals run, marked
        infeasible) or ``none`` (admit every valid goal).
    """

    policy: str = 'feasibility'

    def __post_init__(self):
        check_choice('admission.policy', self.policy, PLUGINS['admission policy'])


@dataclasses.dataclass(frozen=True)
class QueueConfig:
    """Goal queue and goal intake (group ``queue``).

    max_depth: goals that may wait; more are REJECTED (checked before tokenizing).
    max_prompt_chars: cap on prompt + system_prompt, characters; a larger goal is REJECTED
        before any templating or tokenizing (default 65536: twice what fills an 8192-token
        context at ~4 characters per token).
    max_schema_chars: cap on a goal's json_schema, characters; a larger one is REJECTED
        (INVALID_SCHEMA) before it is compiled (default 16384: a robot's tool or plan schema
        is a few hundred to a few thousand).
    max_schema_compile_s: the longest a goal waits for its json_schema's compile, seconds
        (less when its budget is shorter; the compile counts against it): a longer one is
        REJECTED (INVALID_SCHEMA, "too complex"). The compile runs outside the node's
        locks; a schema nested over 64 levels is refused before it (default 2.0: a planner
        schema compiles in ~3-20 ms on 2 idle x86 cores, a loaded ARM board is slower).
    """

    max_depth: int = 16
    max_prompt_chars: int = 65536
    max_schema_chars: int = 16384
    max_schema_compile_s: float = 2.0

    def __post_init__(self):
        for name in ('max_depth', 'max_prompt_chars', 'max_schema_chars'):
            check_count(f'queue.{name}', getattr(self, name))
        check_positive('queue.max_schema_compile_s', self.max_schema_compile_s)


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """Which queued goal runs next (group ``scheduler``, RT-LM Sec. IV-A/B).

    policy: ``fifo`` (order of receipt), ``edf`` (earliest deadline first; RT-LM's HPF with
        the goal's deadline as its priority point), ``luf`` / ``muf`` (least / most
        uncertainty first: smallest / largest u_J), ``slack`` (Eq. 2: least slack
        d_J - now - t^_J first) or ``up`` (Eq. 3, uncertainty-aware priority; units made
        consistent in server/scheduler/up.py).
    up_alpha: alpha of Eq. 3, the weight of the normalised uncertainty u_J / N_max in [0, 1].
    uncertainty: where u_J (predicted response tokens) comes from while a goal waits:
        ``predictor`` (the configured length predictor, run at admission on a CPU thread
        when the goal has to wait; its N^ is reused when the goal runs) or ``none`` (u_J
        unknown while queued: policies that need it treat it as the goal's N_max).
    consolidation: RT-LM's consolidation (Sec. IV-C, Alg. 1): the primary executor runs
        waiting goals of similar u_J together as one decoding batch (server/consolidation.py).
    batch_size: C_f, the most goals in one batch (>= 1), or 0: chosen at start-up from the
        batched-step fit as the smallest probed B whose per-token cost stops falling by more
        than batch_gain at the next probed size (timing.batch.choose_batch_size).
    batch_gain: the share (0, 1) by which the per-token cost must still fall at the next
        batch size for batch_size 0 to grow past a size.
    b: Alg. 1's b (>= 1): the batch is cut from the b x C_f goals of highest priority.
    length_ratio: Alg. 1's lambda (>= 1): a goal joins only while its u_J is at most
        length_ratio x the u_J next to it in the batch (``lambda`` is a Python keyword).
    continuous: continuous batching (vLLM, llama.cpp's server): between decoding steps
        waiting goals join the primary's batch up to batch_size (with consolidation only
        those within length_ratio of a member's u_J); each joiner's prefill pauses the
        batch's decoding.
    """

    policy: str = 'fifo'
    up_alpha: float = 1.0
    uncertainty: str = 'predictor'
    consolidation: bool = False
    batch_size: int = 4
    batch_gain: float = 0.1
    b: float = 1.8
    length_ratio: float = 1.5
    continuous: bool = False

    def __post_init__(self):
        check_choice('scheduler.policy', self.policy, PLUGINS['scheduler policy'])
        check_nonneg_real('scheduler.up_alpha', self.up_alpha)
        check_choice('scheduler.uncertainty', self.uncertainty, UNCERTAINTY_SOURCES)
        check_count('scheduler.batch_size', self.batch_size, minimum=0)  # 0: at start-up
        if (isinstance(self.batch_gain, bool) or not isinstance(self.batch_gain, (int, float))
                or not 0 < self.batch_gain < 1):
            raise ValueError(f'scheduler.batch_gain must be in (0, 1), got {self.batch_gain!r}')
        for name, value in (('scheduler.b', self.b),
                            ('scheduler.length_ratio', self.length_ratio)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1:
                raise ValueError(f'{name} must be a number >= 1, got {value!r}')


@dataclasses.dataclass(frozen=True)
class OffloadConfig:
    """Strategic offloading to a second executor (group ``offload``, RT-LM Sec. IV-D).

    enabled: run a second executor with its own engine instance and time model; a goal
        whose u_J (predicted response tokens, known while it waits) exceeds tau runs there,
        the others on the primary. An idle executor takes the other's goal when that one is
        busy rather than wait.
    device: torch device of the offload engine (``cpu``; on a Jetson the primary is
        ``cuda`` and this the ARM cores).
    dtype: the offload engine's weights as loaded (``engine.dtype`` of its own): ``auto``
        (default) is ``float32`` on a CPU device, whatever ``engine.dtype`` is (the ARM
        cores of a Jetson whose GPU runs ``float16``: fp32 lets ``engine.decode_weights``
        auto take the GGUF kernels or the fastest lean format there, as on any CPU), and
        ``engine.dtype`` on any other device; or ``float32``, ``float16``, ``bfloat16``.
        On the primary's device in the primary's dtype the offload engine shares its
        weights (LlmEngine.twin); otherwise it loads its own copy, and its ``auto`` formats
        (``engine.decode_weights``, ``engine.prefill_dtype``) are chosen on its device.
    threads: torch intra-op threads of the offload engine (with both executors on one CPU,
        give ``engine.threads`` the rest of the cores).
    quantile: k of RT-LM's Eq. 4, in (0, 1): tau = the k-quantile of the predictor's
        predictions over its training prompts (made when the RLP is exported and stored beside
        it as ``<file>.lengths.json``; capped at N_max at start-up).
    """

    enabled: bool = False
    device: str = 'cpu'
    dtype: str = 'auto'
    threads: int = 1
    quantile: float = 0.9

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            raise TypeError(f'offload.enabled must be a bool, got {self.enabled!r}')
        if not isinstance(self.device, str) or not self.device:
            raise TypeError(f'offload.device must be a torch device name, got {self.device!r}')
        check_choice('offload.dtype', self.dtype, OFFLOAD_DTYPES)
        check_count('offload.threads', self.threads)
        check_positive('offload.quantile', self.quantile)
        if not self.quantile < 1:
            raise ValueError(f'offload.quantile must be in (0, 1), got {self.quantile!r}')

    def weight_dtype(self, engine_dtype: str) -> str:
        """Return the offload engine's ``dtype``: ``auto`` resolved against ``engine_dtype``.

        ``engine_dtype``: the primary's ``engine.dtype``. ``auto``: ``float32`` on a CPU
        device, else ``engine_dtype``.
        """
        if self.dtype != 'auto':
            return self.dtype
        return 'float32' if self.device.split(':', 1)[0] == 'cpu' else engine_dtype


@dataclasses.dataclass(frozen=True)
class StatsConfig:
    """Stats and diagnostics (group ``stats``).

    window: size of the sliding window, goals: the last this many goals that reached a
        terminal state.
    period_s: publishing period of ~/stats and /diagnostics, seconds.
    miss_rate_warn: diagnostics WARN when the window's deadline miss rate reaches this, in
        [0, 1].
    miss_rate_error: diagnostics ERROR when the window's deadline miss rate reaches this, in
        [miss_rate_warn, 1].
    firm_m: m of (m,k)-firm deadlines: diagnostics WARN when fewer than firm_m of the last
        firm_k due goals met their deadline (<= firm_k).
    firm_k: k of (m,k)-firm deadlines: the number of last due goals that firm_m is counted
        over.
    """

    window: int = 50
    period_s: float = 1.0
    miss_rate_warn: float = 0.2
    miss_rate_error: float = 0.5
    firm_m: int = 8
    firm_k: int = 10

    def __post_init__(self):
        check_count('stats.window', self.window)
        check_positive('stats.period_s', self.period_s)
        if not 0 <= self.miss_rate_warn <= self.miss_rate_error <= 1:
            raise ValueError(
                'stats.miss_rate_warn <= stats.miss_rate_error in [0, 1] required, got '
                f'{self.miss_rate_warn!r} and {self.miss_rate_error!r}')
        for name in ('firm_m', 'firm_k'):
            check_count(f'stats.{name}', getattr(self, name))
        if self.firm_m > self.firm_k:
            raise ValueError(
                f'stats.firm_m ({self.firm_m}) must be <= stats.firm_k ({self.firm_k})')


@dataclasses.dataclass(frozen=True)
class RosConfig:
    """ROS surface (group ``ros``).

    action_name: name of the Instruct action server; ``~/`` = under the node's name
        (``/timebill/instruct`` for node ``timebill``).
    events_topic: topic of the GoalEvent messages, one per goal that reached a terminal
        state; ``~/`` = under the node's name.
    stats_topic: topic of the ServerStats messages (sliding-window stats, every
        stats.period_s); ``~/`` = under the node's name.
    result_timeout_s: how long the action server keeps a finished goal's result for clients
        that ask late, seconds (rclpy's default on Kilted is 10).
    request_queue_depth: history depth of the action's goal, cancel and result services,
        requests. They are keep-last queues: a burst of more requests than this before the
        executor takes them loses the oldest without a reply (ROS's default depth, 10, lost
        goals of a 16-goal burst here).
    gil_switch_interval_s: the server process's ``sys.setswitchinterval``, seconds: how long
        the decoding thread may hold Python's GIL before a goal, cancel or timer callback gets
        it (Python's default 0.005; 0.001 cut the cancel p99 while decoding from 50.5 to
        35.3 ms, ``bench/studies/responsiveness.py``). Set by ``timebill serve`` only.
    autostart: bring the node to active as soon as it starts (configure, then activate), as a
        lifecycle manager would; false: it waits unconfigured for ``~/change_state``. Read
        by ``timebill serve`` (and so ``llm.launch.py``).
    """

    action_name: str = '~/instruct'
    events_topic: str = '~/events'
    stats_topic: str = '~/stats'
    result_timeout_s: int = 60
    request_queue_depth: int = 1000
    gil_switch_interval_s: float = 0.001
    autostart: bool = True

    def __post_init__(self):
        check_positive('ros.gil_switch_interval_s', self.gil_switch_interval_s)
        check_count('ros.request_queue_depth', self.request_queue_depth)
        check_count('ros.result_timeout_s', self.result_timeout_s)


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """All groups together."""

    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    eviction: EvictionConfig = dataclasses.field(default_factory=EvictionConfig)
    prefix_cache: PrefixCacheConfig = dataclasses.field(default_factory=PrefixCacheConfig)
    budget: BudgetConfig = dataclasses.field(default_factory=BudgetConfig)
    predictor: PredictorConfig = dataclasses.field(default_factory=PredictorConfig)
    timing: TimingConfig = dataclasses.field(default_factory=TimingConfig)
    overrun: OverrunConfig = dataclasses.field(default_factory=OverrunConfig)
    admission: AdmissionConfig = dataclasses.field(default_factory=AdmissionConfig)
    queue: QueueConfig = dataclasses.field(default_factory=QueueConfig)
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    offload: OffloadConfig = dataclasses.field(default_factory=OffloadConfig)
    stats: StatsConfig = dataclasses.field(default_factory=StatsConfig)
    ros: RosConfig = dataclasses.field(default_factory=RosConfig)
