"""The real reranking client libraries pointed at an hllm server (a base URL on loopback), for the rerank tests.

Each function ranks ``documents`` for ``query`` through one client and returns the request indices best
first with their relevance scores: the ``cohere`` SDK (``ClientV2``, v2/rerank; ``Client``, v1/rerank),
LangChain's ``CohereRerank(...).compress_documents`` (langchain-cohere, ClientV2 underneath) and
LlamaIndex's ``CohereRerank`` postprocessor (llama-index-postprocessor-cohere-rerank).
"""

from __future__ import annotations

from hllm.runtime.slates import subslate
from hllm.serve.rerank import SERVED_MODEL

#: Test-only extra that holds these clients (pyproject ``rerank-clients``).
CLIENT_MODULES = ("cohere", "langchain_cohere", "llama_index.postprocessor.cohere_rerank")


def query_of(slate: dict) -> str:
    """The rerank query standing for a sample slate's user context: its most recent history title."""
    return slate["history"][-1]


def query_slates(slates: list[dict], n: int | None = None) -> list[dict]:
    """The slates ``hllm rank`` sees for the rerank requests: history ``[query_of(s)]`` (the rerank mapping),
    the candidates (cut to ``n`` by :func:`subslate` when given), labels dropped."""
    out = []
    for s in slates:
        s = subslate(s, n) if n is not None else s
        out.append({"slate_id": s["slate_id"], "history": [query_of(s)], "candidates": s["candidates"]})
    return out


def cohere_v2(url: str):
    import cohere

    client = cohere.ClientV2(api_key="unused", base_url=url, timeout=120)

    def rank(query: str, documents: list[str]) -> tuple[list[int], list[float]]:
        res = client.rerank(model=SERVED_MODEL, query=query, documents=documents, top_n=len(documents))
        return [r.index for r in res.results], [r.relevance_score for r in res.results]
    return rank


def cohere_v1(url: str):
    import cohere

    client = cohere.Client(api_key="unused", base_url=url, timeout=120)

    def rank(query: str, documents: list[str]) -> tuple[list[int], list[float]]:
        res = client.rerank(model=SERVED_MODEL, query=query, documents=documents)
        assert [r.document.text for r in res.results] == [documents[r.index] for r in res.results]  # v1 default: returned
        return [r.index for r in res.results], [r.relevance_score for r in res.results]
    return rank


def langchain(url: str):
    import cohere
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    reranker = CohereRerank(client=cohere.ClientV2(api_key="unused", base_url=url, timeout=120), model=SERVED_MODEL,
                            top_n=None)

    def rank(query: str, documents: list[str]) -> tuple[list[int], list[float]]:
        docs = [Document(page_content=t, metadata={"i": i}) for i, t in enumerate(documents)]
        out = reranker.compress_documents(docs, query)
        return [d.metadata["i"] for d in out], [d.metadata["relevance_score"] for d in out]
    return rank


def llama_index(url: str):
    from llama_index.core.schema import NodeWithScore, TextNode
    from llama_index.postprocessor.cohere_rerank import CohereRerank

    posts: dict = {}

    def rank(query: str, documents: list[str]) -> tuple[list[int], list[float]]:
        n = len(documents)
        post = posts.get(n) or posts.setdefault(n, CohereRerank(api_key="unused", base_url=url, model=SERVED_MODEL, top_n=n))
        nodes = [NodeWithScore(node=TextNode(text=t, id_=str(i))) for i, t in enumerate(documents)]
        out = post.postprocess_nodes(nodes, query_str=query)
        return [int(n.node.node_id) for n in out], [n.score for n in out]
    return rank


CLIENTS = {"cohere.ClientV2": cohere_v2, "cohere.Client (v1)": cohere_v1, "langchain_cohere.CohereRerank": langchain,
           "llama_index CohereRerank": llama_index}


def rank_all(url: str, slates: list[dict]) -> dict[str, list[tuple[list[int], list[float]]]]:
    """Every client of :data:`CLIENTS` ranks every slate (``query_of`` + candidate titles) through ``url``; the
    clients run at once, one thread each (so the server's micro-batcher merges their requests)."""
    from concurrent.futures import ThreadPoolExecutor

    def run(make) -> list:
        rank = make(url)
        return [rank(query_of(s), [c["title"] for c in s["candidates"]]) for s in slates]

    with ThreadPoolExecutor(len(CLIENTS)) as pool:
        futures = {name: pool.submit(run, make) for name, make in CLIENTS.items()}
        return {name: f.result() for name, f in futures.items()}
