"""Token ids of GGUF files: the engine's tokenizer (engine/gguf) against llama.cpp's.

    timebill study own_model_tokens FILE.gguf [FILE.gguf ...] [--out OUT.md]

For every file: the whole RLP corpus (1,167 robot prompts: plans, logs, maps, JSON, dialogue),
each as plain text and as the engine feeds it (chat template applied where the file has one,
special tokens parsed), tokenized by both; plus a few hard strings (Unicode, emoji, digits,
whitespace runs). Prints and writes the count of prompts whose ids differ (needs
llama-cpp-python: ``make bench-deps``).
"""

import argparse
import datetime
import pathlib
import platform
import sys

HARD = ['Ünïcödé: 東京タワー 🚀 naïve café', 'line1\nline2\n\n  indented\ttab',
        '    four spaces', "I'm sure you'll've done it 1234567 + 89.5e-3", 'x\u00a0y\u200bz',
        'a' * 300, '']


def check(path: pathlib.Path):
    """Return (prompts compared, [differing prompts]) for one file."""
    import llama_cpp

    from timebill_ros.engine.gguf.file import GgufFile
    from timebill_ros.engine.gguf.tokenizer import build_tokenizer
    from timebill_ros.training.corpus import build_corpus
    tokenizer = build_tokenizer(GgufFile(path))
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    texts = HARD + [item.prompt for item in build_corpus()]
    if tokenizer.chat_template is not None:
        texts += [tokenizer.apply_chat_template([{'role': 'user', 'content': t}],
                                                add_generation_prompt=True, tokenize=False)
                  for t in texts[:200]]
    differ = [text for text in texts
              if tokenizer(text)['input_ids']
              != llm.tokenize(text.encode(), add_bos=True, special=True)]
    return len(texts), differ


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('files', nargs='+')
    parser.add_argument('--out', default='')
    args = parser.parse_args()
    import llama_cpp
    names = ' '.join(pathlib.Path(f).name for f in args.files)
    lines = ['# Token ids: the engine against llama.cpp', '',
             f'Command: `timebill study own_model_tokens {names}`; llama-cpp-python '
             f'{llama_cpp.__version__}; {platform.machine()}; {datetime.date.today()}.', '',
             '| file | texts compared | ids differ |', '|---|---|---|']
    for name in args.files:
        total, differ = check(pathlib.Path(name))
        lines.append(f'| {pathlib.Path(name).name} | {total} | {len(differ)} |')
        for text in differ[:5]:
            lines.append(f'|  differs: `{text[:60]!r}` | | |')
    text = '\n'.join(lines) + '\n'
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
