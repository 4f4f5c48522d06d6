"""BERT bucket classifiers (ProxyModel / S3 baselines) on a tiny random BERT + MiniLM tokenizer."""

import random
import shutil

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from timebill_ros.training.dataset import Example
from timebill_ros.training.heads.bert_classifier import (
    BertBucketClassifier, class_length, class_width, default_encoder_dir, proxymodel_5class,
    s3_10class)

N_MODEL = 100  # tokens
SHORT, LONG = 7, 93  # planted lengths, tokens: classes 0 and 4 of 5 (width 20)
TOKENIZER_FILES = ('vocab.txt', 'tokenizer.json', 'tokenizer_config.json',
                   'special_tokens_map.json')
FILLER = ('please tell me about the river mountain city history music food travel garden '
          'science weather ocean animals books computers painting sport').split()


@pytest.fixture(scope='module')
def tiny_dir(tmp_path_factory):
    """Return a folder with a tiny random BertModel and the real MiniLM tokenizer files."""
    folder = tmp_path_factory.mktemp('tiny_bert')
    for name in TOKENIZER_FILES:
        shutil.copy(default_encoder_dir() / name, folder / name)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=64)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    return folder


def make_examples(n, split, seed):
    """Return n examples: 'yes or no' prompts are SHORT tokens, 'in detail' prompts LONG."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        short = i % 2 == 0
        words = rng.sample(FILLER, 6)
        words.insert(rng.randrange(7), 'yes or no' if short else 'in detail')
        out.append(Example(f'{split}{i}', 'test', split, ' '.join(words),
                           SHORT if short else LONG, False, 20, N_MODEL))
    return out


def make_model(tiny_dir, **kw):
    """Return a 5-class classifier on the tiny encoder, CPU, settings for a fast fit."""
    settings = dict(encoder_dir=tiny_dir, max_length=32, epochs=6, batch_size=8, lr=3e-3,
                    seed=3, device='cpu')
    settings.update(kw)
    return BertBucketClassifier(5, name='tiny', **settings)


def test_packaged_minilm_found():
    folder = default_encoder_dir()
    assert (folder / 'config.json').is_file()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert tokenizer('hello world')['input_ids'][0] == tokenizer.cls_token_id


def test_factories(tiny_dir):
    assert proxymodel_5class(encoder_dir=tiny_dir).n_classes == 5
    assert proxymodel_5class(encoder_dir=tiny_dir).name == 'ProxyModel 5-class (MiniLM)'
    s3 = s3_10class(encoder_dir=tiny_dir)
    assert (s3.n_classes, s3.name) == (10, 'S3 10-class (MiniLM)')
    assert proxymodel_5class().encoder_dir == default_encoder_dir()


def test_bucket_conversion(tiny_dir):
    assert class_width(100, 5) == 20
    assert class_width(512, 10) == 52  # ceil(51.2)
    assert class_length(0, 20, 100) == 20
    assert class_length(9, 52, 512) == 512  # upper edge 520 clipped to n_model
    model = make_model(tiny_dir)
    model._set_n_model(make_examples(4, 'train', 0))
    assert model.width == 20
    ex = [Example(str(n), 'c', 'train', 'p', n, False, 1, N_MODEL) for n in (1, 20, 21, 100)]
    np.testing.assert_array_equal(model.labels(ex), [0, 0, 1, 4])
    np.testing.assert_array_equal(model.lengths_of([0, 1, 4]), [20, 40, 100])


def test_learns_planted_relation(tiny_dir):
    model = make_model(tiny_dir)
    model.fit(make_examples(48, 'train', 1), make_examples(16, 'val', 2))
    test = make_examples(20, 'test', 3)
    truth = np.array([e.n_tokens for e in test])
    pred = model.predict_tokens(test)
    assert pred.shape == (20,)
    mae = np.abs(pred - truth).mean()
    majority_mae = min(np.abs(truth - 20).mean(), np.abs(truth - 100).mean())
    assert mae < 0.5 * majority_mae, (mae, majority_mae, model.history)
    assert 1 <= model.best_epoch <= 6 and model.truncated_share_ == 0.0


def test_deterministic_and_save_load(tiny_dir, tmp_path):
    train, val = make_examples(16, 'train', 4), make_examples(8, 'val', 5)
    probe = make_examples(10, 'test', 6)
    a, b = make_model(tiny_dir, epochs=2), make_model(tiny_dir, epochs=2)
    a.fit(train, val)
    b.fit(train, val)
    assert a.history == b.history
    np.testing.assert_array_equal(a.predict_tokens(probe), b.predict_tokens(probe))
    files = a.save(tmp_path / 'clf')
    assert [f.name for f in files] == ['classifier.pt', 'settings.json']
    c = BertBucketClassifier.load(tmp_path / 'clf', device='cpu')
    np.testing.assert_array_equal(c.predict_tokens(probe), a.predict_tokens(probe))


@pytest.mark.parametrize('kw, word', [
    (dict(n_classes=1), 'n_classes'), (dict(max_length=4), 'max_length'),
    (dict(epochs=0), 'epochs'), (dict(batch_size=0), 'batch_size'), (dict(lr=0.0), 'lr')])
def test_bad_args(tiny_dir, kw, word):
    settings = dict(n_classes=5, encoder_dir=tiny_dir)
    settings.update(kw)
    with pytest.raises(ValueError, match=word):
        BertBucketClassifier(**settings)


def test_bad_type_and_data(tiny_dir):
    with pytest.raises(TypeError, match='n_classes'):
        BertBucketClassifier(5.0, encoder_dir=tiny_dir)
    with pytest.raises(ValueError, match='train set is empty'):
        make_model(tiny_dir).fit([], make_examples(4, 'val', 0))
    too_long = make_model(tiny_dir, max_length=128)
    with pytest.raises(ValueError, match='max_length 128'):
        too_long.fit(make_examples(4, 'train', 0), [])
    bad = [Example('x', 'c', 'train', 'p', N_MODEL + 1, True, 1, N_MODEL)]
    with pytest.raises(ValueError, match='n_tokens outside'):
        make_model(tiny_dir).fit(bad, [])
    with pytest.raises(RuntimeError, match='fit'):
        make_model(tiny_dir).predict_tokens(make_examples(2, 'test', 0))
