"""The honest controls for the text tasks: majority class, TF-IDF + logistic regression, nearest-question retrieval.

All are scikit-learn estimators or tiny wrappers around them, fitted on the training split only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from sklearn.dummy import DummyClassifier
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline

from medtx.models.bounds import Positive, PositiveFloat
from medtx.models.registry import FAQAnswerer, ModelContext, ModelSpec, register_model


def majority_classifier() -> DummyClassifier:
    """Always predicts the most frequent training class (probabilities = training class shares)."""
    return DummyClassifier(strategy="prior")


def tfidf_logreg(
    *, max_features: int = 50_000, ngram_max: int = 2, C: float = 10.0, balanced: bool = True, seed: int = 0
) -> Pipeline:
    """TF-IDF (sublinear tf, word 1-2-grams, min_df 2) -> multinomial logistic regression.

    `balanced` weights classes inversely to their frequency, which is what macro-F1 rewards on MTSamples'
    long-tailed 40 classes.
    """
    return make_pipeline(
        TfidfVectorizer(sublinear_tf=True, ngram_range=(1, ngram_max), min_df=2, max_features=max_features),
        LogisticRegression(C=C, max_iter=2000, class_weight="balanced" if balanced else None, random_state=seed),
    )


class TfidfRetriever:
    """Nearest-question retrieval: answer a query with the answer of the most similar training question.

    Similarity is cosine over TF-IDF vectors (word 1-2-grams) — or over sentence embeddings when
    `embed` is given (e.g. MiniLM mean-pooled embeddings, `FAQTools.sentence_embedder`).
    """

    def __init__(self, embed=None) -> None:
        self.embed = embed
        self.vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2))

    def fit(self, questions: Sequence[str], answers: Sequence[str]) -> TfidfRetriever:
        if len(questions) != len(answers) or not questions:
            raise ValueError("retrieval: need the same, non-zero number of questions and answers")
        self.answers = list(answers)
        self.matrix = self._encode(list(questions), fit=True)
        return self

    def _encode(self, texts: list[str], fit: bool = False) -> np.ndarray:
        if self.embed is not None:
            vectors = np.asarray(self.embed(texts), dtype=np.float64)
        else:
            vectors = (self.vectorizer.fit_transform(texts) if fit else self.vectorizer.transform(texts)).toarray()
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms == 0, 1.0, norms)

    def scores(self, queries: Sequence[str]) -> np.ndarray:
        """[n_queries, n_train] cosine similarities."""
        return self._encode(list(queries)) @ self.matrix.T

    def predict(self, queries: Sequence[str]) -> list[str]:
        return [self.answers[i] for i in self.scores(queries).argmax(axis=1)]


@dataclass
class TfidfConfig:
    """The settings tfidf_logreg reads (flat override keys; bounds checked at config load)."""

    tfidf_C: PositiveFloat = 10.0
    tfidf_max_features: Positive = 50_000


def build_majority(ctx: ModelContext) -> DummyClassifier:
    return majority_classifier()


def build_tfidf_logreg(ctx: ModelContext) -> Pipeline:
    """Class-balanced unless the run's class_weighting is none."""
    cfg = ctx.config(TfidfConfig)
    return tfidf_logreg(C=cfg.tfidf_C, max_features=cfg.tfidf_max_features,
                        balanced=ctx.settings.class_weighting != "none", seed=ctx.seed)


_TEXT_KINDS = ("multiclass", "binary")
@dataclass
class RetrievalConfig:
    """The settings FAQ retrieval reads: what the questions are compared by."""

    embedding: Literal["tfidf", "minilm"] = "tfidf"  # TF-IDF vectors or MiniLM sentence embeddings


def build_retrieval(ctx: ModelContext) -> FAQAnswerer:
    """Answer each held-out question with the answer of the most similar question of the fold."""
    cfg = ctx.config(RetrievalConfig)
    embed = ctx.tools.sentence_embedder() if cfg.embedding == "minilm" else None
    if cfg.embedding not in ("tfidf", "minilm"):
        raise ValueError(f"FAQ retrieval embedding must be tfidf or minilm, got {cfg.embedding!r}")

    def answer(fold: int, questions: list[str], answers: list[str], queries: list[str], folder=None,
               on_epoch=None) -> list[str]:
        return TfidfRetriever(embed=embed).fit(questions, answers).predict(queries)

    return FAQAnswerer(answer)


# reference: the preference as a task's reference baseline (medtx.models.registry.ModelSpec.reference)
register_model(ModelSpec(name="majority", family="text_baseline", kinds=_TEXT_KINDS, rank=10, build=build_majority,
                         reference=60))
register_model(ModelSpec(name="tfidf_logreg", family="text_baseline", kinds=_TEXT_KINDS, rank=20,
                         build=build_tfidf_logreg, settings=(TfidfConfig,), reference=20))
register_model(ModelSpec(name="retrieval", family="faq", kinds=("generation",), rank=20, reference=30,
                         build=build_retrieval, settings=(RetrievalConfig,)))
