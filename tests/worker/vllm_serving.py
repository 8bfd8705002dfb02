"""vLLM's own OpenAI serving classes over a batch file, for lines its `run_batch` does not take.

    python tests/worker/vllm_serving.py -i IN.jsonl -o OUT.jsonl --model M [vLLM's run_batch flags]

vLLM 0.32's `run_batch` answers /v1/chat/completions but not /v1/responses. This builds the same
engine client and serving objects `run_batch` builds (vLLM's `init_app_state`), then hands each
line to `OpenAIServingResponses.create_responses` (/v1/responses) or
`OpenAIServingChat.create_chat_completion` (/v1/chat/completions): vLLM's real request models,
sampling parameters, chat rendering and parsers. Each output line is {"custom_id", "body"}.
"""

from __future__ import annotations

import asyncio
import json

from starlette.datastructures import State
from vllm.entrypoints.launchers.api_server.app_state import init_app_state
from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
from vllm.entrypoints.launchers.run_batch import parse_args
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.usage.usage_lib import UsageContext


async def main() -> None:
    args = parse_args()
    async with build_async_engine_client(args, usage_context=UsageContext.OPENAI_BATCH_RUNNER) as client:
        state = State()
        await init_app_state(client, state, args, await client.get_supported_tasks())
        with open(args.input_file) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        out = []
        for line in lines:
            if line["url"] == "/v1/responses":
                answer = await state.openai_serving_responses.create_responses(
                    ResponsesRequest.model_validate(line["body"])
                )
            else:
                answer = await state.openai_serving_chat.create_chat_completion(
                    ChatCompletionRequest.model_validate(line["body"])
                )
            out.append({"custom_id": line["custom_id"], "body": answer.model_dump(mode="json")})
        with open(args.output_file, "w") as f:
            f.writelines(json.dumps(o) + "\n" for o in out)


if __name__ == "__main__":
    asyncio.run(main())
