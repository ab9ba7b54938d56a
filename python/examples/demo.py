"""Streams a chat answer from SmolLM2-135M-Instruct through the Python package.

Run with `npm run demo:python [-- "your question"]` (builds the package and fetches the model
on first use), or `python python/examples/demo.py MODEL [QUESTION]` where the package is installed.
"""

import sys

from expert_runtime import Runtime


def main() -> None:
    model = sys.argv[1]
    question = " ".join(sys.argv[2:]).strip() or "What is the capital of France? Answer in one sentence."
    with Runtime.load(model) as rt, rt.create_session(system="You are a helpful assistant.") as chat:
        print(f"> {question}\n")
        # Ctrl-C cancels the answer cleanly (KeyboardInterrupt leaves the loop).
        with chat.generate(question, temperature=0, max_tokens=256) as stream:
            for chunk in stream:
                print(chunk.text, end="", flush=True)
        r = stream.result
        info = rt.info
        print(
            f"\n\n[{r.usage.completion_tokens} tokens, {r.timings.tokens_per_second:.1f} tok/s, "
            f"first token after {r.timings.ttft_ms:.0f} ms, {info['architecture']} on {info['device']}]"
        )


if __name__ == "__main__":
    main()
