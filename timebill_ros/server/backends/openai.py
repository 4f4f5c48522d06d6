"""The OpenAI-compatible backend (``engine.backend: openai``): llama.cpp's server, vLLM, ...

The wire format of ``/completions`` and ``/chat/completions`` (``engine.remote_api``): the
request body, the streamed chunks (``choices[].text`` or ``delta.content``,
``finish_reason``, ``usage``, the ``[DONE]`` line) and ``/models``. The pipeline, the probes
and the build are the remote backends' (backends/remote.py).
"""

import json

from timebill_ros.engine.remote.client import excerpt, get_json, HTTP, RemoteError
from timebill_ros.server.backends.remote import RemoteBackend, WireFormat


class OpenAiApi(WireFormat):
    """OpenAI's completions and chat completions, as llama.cpp's server and vLLM speak them."""

    def path(self, engine_config) -> str:
        """Return ``/chat/completions`` or ``/completions`` (``engine.remote_api``)."""
        return '/chat/completions' if engine_config.remote_api == 'chat' else '/completions'

    def body(self, model, request, messages, max_tokens, engine_config) -> dict:
        """Return a goal's request: its prompt, max_tokens, sampling and stops."""
        body = {'model': model.name, 'max_tokens': int(max_tokens),
                'temperature': float(request.temperature)}
        if engine_config.remote_api == 'chat':
            body['messages'] = model.chat_messages(request.prompt, request.system_prompt,
                                                   messages)
        else:
            body['prompt'] = model.prompt_text(request.prompt, request.system_prompt, messages)
        if request.temperature > 0:
            body['top_p'] = float(request.top_p or 1.0)
            if request.top_k:
                body['top_k'] = int(request.top_k)
            if request.seed is not None:
                body['seed'] = int(request.seed)
        if request.repetition_penalty and request.repetition_penalty != 1.0:
            # llama.cpp's name, and vLLM's.
            body['repeat_penalty'] = body['repetition_penalty'] = float(
                request.repetition_penalty)
        if request.stop:
            body['stop'] = list(request.stop)
        return body

    def probe_body(self, model, text, max_tokens, engine_config) -> dict:
        """Return a greedy request of the user turn ``text``."""
        body = {'model': model.name, 'max_tokens': max_tokens, 'temperature': 0.0}
        if engine_config.remote_api == 'chat':
            body['messages'] = model.chat_messages(text)
        else:
            body['prompt'] = model.prompt_text(text)
        return body

    def parse_chunk(self, data: bytes):
        """Return (texts, finish_reason, usage) of one chunk (:func:`parse_chunk`)."""
        return parse_chunk(data)

    def list_models(self, endpoint, timeout_s) -> list:
        """Return the ids ``/models`` lists (:func:`list_models`)."""
        return list_models(endpoint, timeout_s)


class OpenAiBackend(RemoteBackend):
    """``engine.backend: openai``: an engine serving the OpenAI-compatible API."""

    name = 'openai'
    api = OpenAiApi()


def list_models(endpoint, timeout_s: float) -> list:
    """Return the model ids the server's ``/models`` lists (RemoteError naming a bad shape)."""
    body = get_json(endpoint, '/models', timeout_s)
    data = body.get('data') if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise RemoteError(HTTP, f'/models: expected {{"data": [...]}}, got '
                                f'{excerpt(body)}')
    ids = []
    for entry in data:
        if not isinstance(entry, dict) or not isinstance(entry.get('id'), str):
            raise RemoteError(HTTP, f'/models: an entry without a string "id": '
                                    f'{excerpt(entry)}')
        ids.append(entry['id'])
    return ids


def parse_chunk(data: bytes):
    """Return (texts, finish_reason, usage) of one stream chunk's JSON ``data``.

    texts: the tokens' texts it streams, in order; finish_reason: str or None; usage: dict
    or None. RemoteError (HTTP) when it is not JSON, reports an error, or a field has the
    wrong type (a number for a text, a list for a finish_reason, ...).
    """
    try:
        chunk = json.loads(data)
    except ValueError as exc:
        raise RemoteError(HTTP, f'a stream chunk is not JSON: {excerpt(data)}') from exc
    if not isinstance(chunk, dict):
        raise RemoteError(HTTP, f'a stream chunk is not an object: {excerpt(chunk)}')
    if 'error' in chunk:
        raise RemoteError(HTTP, f'the engine reported: {excerpt(chunk["error"], 200)}')
    usage = chunk.get('usage')
    choices = chunk.get('choices') or []
    if usage is not None and not isinstance(usage, dict):
        raise RemoteError(HTTP, f'a stream chunk\'s usage is not an object: {excerpt(usage)}')
    if not isinstance(choices, list):
        raise RemoteError(HTTP, f'a stream chunk\'s choices are not a list: '
                                f'{excerpt(choices)}')
    texts, finish = [], None
    for choice in choices:
        if not isinstance(choice, dict):
            raise RemoteError(HTTP, f'a stream choice is not an object: {excerpt(choice)}')
        text = choice.get('text')
        if text is None:  # the chat endpoint's delta; its role chunk is no token
            delta = choice.get('delta') or {}
            if not isinstance(delta, dict):
                raise RemoteError(HTTP, f'a stream delta is not an object: {excerpt(delta)}')
            text = delta.get('content') or None
        reason = choice.get('finish_reason')
        for name, value in (('text', text), ('finish_reason', reason)):
            if value is not None and not isinstance(value, str):
                raise RemoteError(HTTP, f'a stream choice\'s {name} is not a string: '
                                        f'{excerpt(value)}')
        if reason:
            finish = reason
            if text:
                texts.append(text)
        elif text is not None:
            texts.append(text)
    return texts, finish, usage
