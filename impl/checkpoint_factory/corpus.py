"""A small embedded English corpus for training the tiny test tokenizer.

Varied on purpose: prose, dialogue, code, numbers, punctuation and some
non-ASCII text (accents, CJK, emoji) so that byte-level merges exist for
multi-byte UTF-8 characters and incremental detokenization has something to
hold back. Changing this text changes every tiny checkpoint's hash.
"""

CORPUS = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Once upon a time, in a small village by the sea, there lived an old fisherman and his clever daughter.
Every morning they rowed out past the lighthouse, counted the gulls, and came home before noon.
"How many fish did you catch today?" asked the baker. "Seventeen," she said, "and one old boot!"

Machine learning models read text as tokens. A tokenizer splits text into pieces, and the model
predicts the next piece, one step at a time. Serving engines batch many requests together, keep a
cache of keys and values for every layer, and stream the answer back to the user as it is generated.
Fast prefill skips work: the shared layers only run on the rows whose logits are needed.

Numbers appear everywhere: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 42, 100, 256, 512, 1024, 2048, 3.14159,
2.71828, -17, +23, 1e-6, 99.9%, $4.50, 12:30 pm, 2024-06-01, version 1.2.3, room 404, call 555-0199.
Punctuation too: commas, periods. Questions? Exclamations! Semi-colons; colons: dashes - and -- and
"quotes", 'single quotes', (parentheses), [brackets], {braces}, <angles>, slashes / \\ | and #hashes.

def add(a, b):
    return a + b

for i in range(10):
    print(i * i, end=", ")

if __name__ == "__main__":
    result = {"name": "tiny", "layers": 35, "shared": 20, "ok": True}

She ordered a café au lait and a croissant at the little café near the station. His naïve plan
was to learn Spanish, French and German in one summer: ¿Dónde está la biblioteca? Où est la gare?
Wie geht es dir? Straße, Ärger, Übung, Öl, façade, jalapeño, résumé, coöperate, smörgåsbord.
Greek letters: α β γ δ ε λ μ π σ ω. Math: ∑ ∫ √ ∞ ≈ ≠ ≤ ≥ ± × ÷ °C.
Japanese: こんにちは世界。Chinese: 你好，世界。Korean: 안녕하세요. Russian: Привет, мир!
Emoji make people smile 😀 😂 👍 🎉 🚀 ❤️ 🌍 🐍 and sometimes they combine like 👩‍💻 or 🏳️‍🌈.

The weather today is sunny with a light breeze from the west. Tomorrow there may be rain in the
afternoon, so bring an umbrella. In the evening the sky turned orange, then purple, then dark blue.
Users asked questions and the assistant answered them politely, clearly and briefly.
User: What is the capital of France? Assistant: The capital of France is Paris.
User: Write a short poem about the moon. Assistant: Silver lantern, quiet and bright, you keep the
sleeping sea company all night.
"""
