"""Status, phase and policy codes shared by the core and the ROS adapter.

They mirror the constants of ``action/Instruct.action``; a test checks that the generated
interface agrees. The core uses these so it never imports message types.
"""

# Result status codes.
COMPLETED = 1
KILLED = 2
SKIPPED = 3
REJECTED = 4
CANCELED = 5
FAILED = 6

STATUS_NAMES = {
    COMPLETED: 'COMPLETED', KILLED: 'KILLED', SKIPPED: 'SKIPPED',
    REJECTED: 'REJECTED', CANCELED: 'CANCELED', FAILED: 'FAILED',
}

# Feedback phases.
PHASE_QUEUED = 0
PHASE_PREFILL = 1
PHASE_DECODE = 2

# Overrun policies as sent in a goal.
POLICY_DEFAULT = 0
POLICY_KILL = 1
POLICY_SKIP_NEXT = 2
POLICY_PARTIAL = 3

# Why a goal's answer ended (result and GoalEvent ``finish_reason``): one word per way.
FINISH_EOS = 'eos'                # the model ended its answer
FINISH_LENGTH = 'length'          # max_new_tokens (or the model's context) reached
FINISH_STOP = 'stop'              # a stop string appeared (the response ends before it)
FINISH_REPETITION = 'repetition'  # the loop guard: the answer repeated a cycle (cut there)
FINISH_DEADLINE = 'deadline'      # its deadline stopped it (Kill, Partial, or expired queued)
FINISH_CANCELED = 'canceled'      # its client canceled it
FINISH_REJECTED = 'rejected'      # refused before running (bad input, queue full, infeasible)
FINISH_SKIPPED = 'skipped'        # skip-next: came due while another goal overran
FINISH_SHUTDOWN = 'shutdown'      # the server shut down
FINISH_ERROR = 'error'            # an internal error ended it
FINISH_REASONS = (FINISH_EOS, FINISH_LENGTH, FINISH_STOP, FINISH_REPETITION, FINISH_DEADLINE,
                  FINISH_CANCELED, FINISH_REJECTED, FINISH_SKIPPED, FINISH_SHUTDOWN,
                  FINISH_ERROR)
# The finish reason a status implies when nothing more precise was recorded.
FINISH_OF_STATUS = {KILLED: FINISH_DEADLINE, SKIPPED: FINISH_SKIPPED,
                    REJECTED: FINISH_REJECTED, CANCELED: FINISH_CANCELED, FAILED: FINISH_ERROR}

# Error codes (result and GoalEvent ``error_code``), one per cause; 0 when the goal completed
# or its client canceled it. The message beside it names the field or the figures.
ERROR_NONE = 0
ERROR_INVALID_TIMING = 101      # time_budget / deadline: none, both, not > 0, already past
ERROR_INVALID_PROMPT = 102      # prompt, system_prompt or messages: empty, wrong type or role
ERROR_INVALID_OPTION = 103      # overrun_policy, max_new_tokens, stop or a sampling field
ERROR_INVALID_SCHEMA = 104      # json_schema: not JSON, or a schema the grammar cannot take
ERROR_PROMPT_TOO_LARGE = 110    # more characters than queue.max_prompt_chars
ERROR_CONTEXT_OVERFLOW = 111    # the templated prompt has no room left in the model context
ERROR_QUEUE_FULL = 120          # queue.max_depth goals already wait
ERROR_INFEASIBLE = 130          # cannot fit its budget (min_time says why): at admission or
#                                 when it left the queue
ERROR_DEADLINE = 131            # KILLED: its deadline stopped it (or passed while it waited)
ERROR_SKIPPED_OVERRUN = 132     # SKIPPED: came due while another goal overran (skip-next)
ERROR_INACTIVE = 140            # the node is not active (lifecycle): configure and activate it
ERROR_SHUTDOWN = 150            # the server shut down (or cleaned up) before the goal ended
ERROR_INTERNAL = 160            # a model, predictor or server fault; the message says which
# engine.backend openai: the remote engine failed the goal (engine/remote/client.py).
ERROR_REMOTE_UNREACHABLE = 170  # the connection was refused (the engine is down) or failed
ERROR_REMOTE_TIMEOUT = 171      # connecting, or the engine went silent mid-answer
ERROR_REMOTE_BUSY = 172         # HTTP 429 / 503: the engine refused more work
ERROR_REMOTE_HTTP = 173         # another HTTP error, or an error the engine streamed
ERROR_REMOTE_STREAM = 174       # the stream was cut mid-answer (the engine died or restarted)
ERROR_CODES = {
    'NONE': ERROR_NONE, 'INVALID_TIMING': ERROR_INVALID_TIMING,
    'INVALID_PROMPT': ERROR_INVALID_PROMPT, 'INVALID_OPTION': ERROR_INVALID_OPTION,
    'INVALID_SCHEMA': ERROR_INVALID_SCHEMA, 'PROMPT_TOO_LARGE': ERROR_PROMPT_TOO_LARGE,
    'CONTEXT_OVERFLOW': ERROR_CONTEXT_OVERFLOW, 'QUEUE_FULL': ERROR_QUEUE_FULL,
    'INFEASIBLE': ERROR_INFEASIBLE, 'DEADLINE': ERROR_DEADLINE,
    'SKIPPED_OVERRUN': ERROR_SKIPPED_OVERRUN,
    'INACTIVE': ERROR_INACTIVE, 'SHUTDOWN': ERROR_SHUTDOWN, 'INTERNAL': ERROR_INTERNAL,
    'REMOTE_UNREACHABLE': ERROR_REMOTE_UNREACHABLE, 'REMOTE_TIMEOUT': ERROR_REMOTE_TIMEOUT,
    'REMOTE_BUSY': ERROR_REMOTE_BUSY, 'REMOTE_HTTP': ERROR_REMOTE_HTTP,
    'REMOTE_STREAM': ERROR_REMOTE_STREAM,
}
ERROR_NAMES = {code: name for name, code in ERROR_CODES.items()}
# The error code a status implies when nothing more precise was recorded.
ERROR_OF_STATUS = {KILLED: ERROR_DEADLINE, SKIPPED: ERROR_SKIPPED_OVERRUN,
                   FAILED: ERROR_INTERNAL}

# How each status ends the action: 'succeed', 'abort' or 'canceled'.
ACTION_OUTCOME = {
    COMPLETED: 'succeed', KILLED: 'abort', SKIPPED: 'abort',
    REJECTED: 'abort', CANCELED: 'canceled', FAILED: 'abort',
}
