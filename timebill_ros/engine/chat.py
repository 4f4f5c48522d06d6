"""The chat-formatted prompt of a goal: one home for the local engine and the remote backend."""


def chat_turns(prompt: str, system_prompt: str = '', messages=()) -> list:
    """Return the goal's conversation as OpenAI-style ``{'role', 'content'}`` dicts.

    ``system_prompt`` (a system turn, when not empty), then ``messages`` (``(role, content)``
    pairs: an earlier conversation), then ``prompt`` (a user turn, when not empty, or when
    there is nothing else).
    """
    for name, value in (('prompt', prompt), ('system_prompt', system_prompt)):
        if not isinstance(value, str):
            raise TypeError(f'{name} must be a str, got {value!r}')
    turns = [{'role': 'system', 'content': system_prompt}] if system_prompt else []
    turns += [{'role': role, 'content': content} for role, content in messages]
    if prompt or not turns:
        turns.append({'role': 'user', 'content': prompt})
    return turns


def chat_text(tokenizer, prompt: str, system_prompt: str = '', messages=()) -> str:
    """Return the prompt text the model reads: its chat template applied to the turns.

    The template is applied with ``add_generation_prompt=True``; without a system turn
    SmolLM2's template inserts its default one. A tokenizer without a chat template (a base
    model's GGUF) gets the contents joined by blank lines, as plain text.
    """
    turns = chat_turns(prompt, system_prompt, messages)
    if getattr(tokenizer, 'chat_template', None) is None:
        return '\n\n'.join(turn['content'] for turn in turns if turn['content'])
    return tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)


def encode_chat(tokenizer, prompt: str, system_prompt: str = '', messages=()) -> list:
    """Return the token ids of :func:`chat_text`, ready for generation.

    A template's text already holds its special tokens, so none are added; a base model's
    plain text gets the BOS its tokenizer asks for.
    """
    text = chat_text(tokenizer, prompt, system_prompt, messages)
    if getattr(tokenizer, 'chat_template', None) is None:
        return list(tokenizer(text)['input_ids'])
    return list(tokenizer(text, add_special_tokens=False)['input_ids'])
