"""A GGUF file read by the engine itself: hyperparameters, weights, tokenizer, chat template.

``engine.model_path: <file>.gguf`` loads through here (engine/models): no transformers model
and no fp32 copy of the weights. ``file.GgufFile`` reads the metadata and tensors with the
``gguf`` package; ``tokenizer.build_tokenizer`` makes the file's tokenizer (checked against
llama.cpp's).
"""
