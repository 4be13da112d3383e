"""Every span name, attribute key, event name and metric name turnfsm emits.

The GenAI semantic conventions are in development, and their Python
constants (``opentelemetry.semconv._incubating``) are deprecated as they
move, so turnfsm spells the strings it uses here, once. Everything that is
not a GenAI convention lives under ``turnfsm.*``, with low-cardinality span
names.
"""

from __future__ import annotations

from typing import Final

# -- GenAI semantic conventions --------------------------------------------
OPERATION_NAME: Final = "gen_ai.operation.name"
PROVIDER_NAME: Final = "gen_ai.provider.name"
REQUEST_MODEL: Final = "gen_ai.request.model"
REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
RESPONSE_MODEL: Final = "gen_ai.response.model"
RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
CONVERSATION_ID: Final = "gen_ai.conversation.id"
CONVERSATION_COMPACTED: Final = "gen_ai.conversation.compacted"
AGENT_NAME: Final = "gen_ai.agent.name"
USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
USAGE_CACHE_WRITE_TOKENS: Final = "gen_ai.usage.cache_creation.input_tokens"
TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
TOOL_TYPE: Final = "gen_ai.tool.type"
TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
INPUT_MESSAGES: Final = "gen_ai.input.messages"
OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS: Final = "gen_ai.system_instructions"
TOKEN_TYPE: Final = "gen_ai.token.type"
ERROR_TYPE: Final = "error.type"
# An exception event's, for an error that reached the run as a value.
EXCEPTION_TYPE: Final = "exception.type"
EXCEPTION_MESSAGE: Final = "exception.message"

OP_INVOKE_AGENT: Final = "invoke_agent"
OP_CHAT: Final = "chat"
OP_EXECUTE_TOOL: Final = "execute_tool"

# The error.type of a tool call a resumed run closed as interrupted.
TOOL_INTERRUPTED: Final = "tool_interrupted"

# -- resource ----------------------------------------------------------------
SERVICE_NAME: Final = "service.name"  # Jaeger's service
PROJECT_NAME: Final = "openinference.project.name"  # Phoenix's project

# -- turnfsm ---------------------------------------------------------------
# A span that holds model calls (a run, a turn, a compaction pass) says what
# they reported under these: the gen_ai.usage ones are only on the model
# calls' own spans, so that summing them over a trace counts each call once.
TOTAL_INPUT_TOKENS: Final = "turnfsm.usage.input_tokens"
TOTAL_OUTPUT_TOKENS: Final = "turnfsm.usage.output_tokens"
TOTAL_CACHE_READ_TOKENS: Final = "turnfsm.usage.cache_read.input_tokens"
TOTAL_CACHE_WRITE_TOKENS: Final = "turnfsm.usage.cache_creation.input_tokens"
RUN_ID: Final = "turnfsm.run.id"
RUN_OUTCOME: Final = "turnfsm.run.outcome"
RUN_TURNS: Final = "turnfsm.run.turns"
RUN_RESUMED: Final = "turnfsm.run.resumed"
RUN_RESUMED_FROM: Final = "turnfsm.run.resumed_from"
MACHINE_NAME: Final = "turnfsm.machine.name"
MACHINE_DIGEST: Final = "turnfsm.machine.digest"
PHASE: Final = "turnfsm.phase"
ESTIMATE: Final = "turnfsm.estimate"
ESTIMATE_SOURCE: Final = "turnfsm.estimate.source"
WINDOW: Final = "turnfsm.context.window"
THRESHOLD_LINE: Final = "turnfsm.context.threshold_line"
EMERGENCY_LINE: Final = "turnfsm.context.emergency_line"
TURN_NUMBER: Final = "turnfsm.turn.number"
ATTEMPT: Final = "turnfsm.attempt"
RETRY_WAIT: Final = "turnfsm.retry.wait"
PURPOSE: Final = "turnfsm.purpose"
CANCELLED: Final = "turnfsm.cancelled"
EFFECT: Final = "turnfsm.effect"
COMPACTION_REASON: Final = "turnfsm.compaction.reason"
COMPACTION_STRATEGY: Final = "turnfsm.compaction.strategy"
COMPACTION_OUTCOME: Final = "turnfsm.compaction.outcome"
TOKENS_BEFORE: Final = "turnfsm.compaction.tokens_before"
TOKENS_AFTER: Final = "turnfsm.compaction.tokens_after"
TOKENS_SAVED: Final = "turnfsm.compaction.tokens_saved"
TOKENS_SOURCE: Final = "turnfsm.compaction.tokens_source"
CACHE_INVALIDATED: Final = "turnfsm.compaction.cache.invalidated_tokens"
CACHE_REWRITTEN: Final = "turnfsm.compaction.cache.rewritten_tokens"
CACHE_COST: Final = "turnfsm.compaction.cache.cost_usd"
CACHE_SAVING: Final = "turnfsm.compaction.cache.saving_per_call_usd"
CACHE_PAYBACK_CALLS: Final = "turnfsm.compaction.cache.payback_calls"
CACHE_DECLINED: Final = "turnfsm.compaction.cache.declined"
TRANSITION_FROM: Final = "turnfsm.transition.from"
TRANSITION_TO: Final = "turnfsm.transition.to"
TRANSITION_TRIGGER: Final = "turnfsm.transition.trigger"
TRANSITION_INDEX: Final = "turnfsm.transition.index"
TRANSITION_GUARDS: Final = "turnfsm.transition.guards"
TRANSITION_REASON: Final = "turnfsm.transition.reason"
TRANSITION_ERROR: Final = "turnfsm.transition.error"

# -- span and event names ----------------------------------------------------
SPAN_TURN: Final = "turnfsm.turn"
SPAN_COMPACTION: Final = "turnfsm.compaction"
SPAN_EFFECT: Final = "turnfsm.effect"
EVENT_TRANSITION: Final = "turnfsm.transition"
EVENT_EXCEPTION: Final = "exception"

# -- metrics -----------------------------------------------------------------
METRIC_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
METRIC_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
METRIC_COMPACTIONS: Final = "turnfsm.compactions"
METRIC_TOKENS_SAVED: Final = "turnfsm.compaction.tokens_saved"
METRIC_PHASE_DURATION: Final = "turnfsm.phase.duration"
METRIC_RUNS: Final = "turnfsm.runs"

# The GenAI conventions' advised histogram buckets.
TOKEN_BUCKETS: Final = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
    16777216, 67108864,
)  # fmt: skip
DURATION_BUCKETS: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
    40.96, 81.92,
)  # fmt: skip
