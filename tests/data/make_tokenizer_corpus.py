#!/usr/bin/env python3
"""Writes the tokenizer agreement corpus: tests/data/tokenizer_corpus.txt (one text a
line) and tests/data/tokenizer_pairs.txt (text TAB pair a line), deterministic from a
fixed seed. The lines mix what trips tokenizers: accents and combining marks (with dense
runs that NFD reorders), emoji (with skin tones, ZWJ sequences and flags), CJK, Japanese,
Korean, Thai, Arabic, Hebrew, Devanagari, Cyrillic and Greek, mixed scripts, long
whitespace runs, tabs and unusual spaces, numbers in several scripts, URLs, code,
contractions, control and format characters, special tokens written in the text, empty
lines and words of more than 100 characters. Lines never hold '\\n' or NUL (the files are
line-based text); '\\r' appears inside lines only.

usage: tests/data/make_tokenizer_corpus.py [OUTDIR]   (default: this script's folder)
"""
import os
import random
import sys

SEED = 20261125
N_LINES = 2400
N_PAIRS = 1200

ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged, isn't it?",
    "We're going to the market; they'll meet us there, and I'd rather walk.",
    "You've GOT to be kidding me -- SHE'S HERE'S THEY'RE (upper-case contractions).",
    "Don't stop believin'; rock'n'roll ain't noise pollution.",
    "O'Neill and D'Angelo met at the 'quoted' café at 5 o'clock.",
    "Tokenization isn't easy: unaffable, unbelievably, antidisestablishmentarianism.",
    "Mr. Smith paid $1,234.56 (plus 7.5% tax) on 2024-03-15 at 09:30 a.m.",
    "Email jane.doe+test@example.co.uk or call +1 (555) 010-9999 ext. 42.",
    "See https://en.wikipedia.org/wiki/Byte_pair_encoding#Algorithm?x=1&y=two for details.",
    "The ratio was 3:2, i.e. 1.5x; roughly 10^6 events/sec — impressive!",
    "Hyphen-ated, under_scored, camelCaseWords, and SCREAMING_SNAKE_CASE.",
    "What?! No way... Really??? Yes!!!",
    "Fine-tuning BERT on GLUE: MNLI, QQP, SST-2, CoLA; GPT-2 for LM.",
]

ACCENTED = [
    "Café crème brûlée à la française, s'il vous plaît.",
    "Straße, Größe, Übermäßig, Fußgängerübergänge — ÄÖÜ äöü ß ẞ.",
    "¿Dónde está la estación? ¡Mañana será otro día! Pingüino, añejo.",
    "São Paulo, coração, ação, pão; Tiên học lễ, hậu học văn — Tiếng Việt.",
    "Ångström, Æsir, Ørsted, Þórr, Ðavid, œuvre, Ærøskøbing.",
    "İstanbul'da ılık bir gün; IĞDIR, ŞİŞLİ, çiğköfte, Ağrı.",
    "Zürich, Čeština, Łódź, Kraków, Žižkov, Šibenik, Ėnergija.",
    "naïve coöperate résumé façade jalapeño piñata señor Noël.",
    "ǅemal ǈubica ǋegoš — titlecase digraphs; ﬁnance ﬂow ﬀ ligatures.",
]

COMBINING = [
    "e\u0301 a\u0300 o\u0302 u\u0308 n\u0303 c\u0327 (decomposed accents)",
    "Z\u0351\u036b\u0343\u036a\u0302a\u0306\u0300l\u0351\u0314g\u0310o\u030f\u0306 text with stacked marks",
    "a\u0323\u0301 q\u0307\u0323 s\u0323\u0307 d\u0327\u0304 (marks in non-canonical order)",
    "\u0301 leading combining mark, and a trailing one x\u0308",
    "\u1e9b\u0323 \u1e0b\u0323 \u0071\u0307\u0323 ordering tests",
    "Hangul jamo: \u1100\u1161\u11a8 and precomposed 한국어 텍스트",
]

EMOJI = [
    "I love it 😍😍😍 so much 🎉🎊!",
    "Thumbs 👍🏻👍🏽👍🏿 and family 👨‍👩‍👧‍👦 and flags 🇺🇸🇯🇵🇫🇷.",
    "Rocket 🚀 to the moon 🌕, fire 🔥, hundred 💯, heart ❤️ ♥ ☺️.",
    "New emoji: 🥰 🥳 🫠 🫶 🪼 and keycaps 1️⃣ #️⃣ *️⃣.",
    "Technologist 🧑‍💻, woman scientist 👩🏾‍🔬, rainbow flag 🏳️‍🌈.",
    "Symbols ✓ ✗ ★ ☆ ♠ ♣ ♦ ∞ ≈ ≠ ≤ ≥ ± × ÷ √ ∑ ∫ ∂ ∇ € £ ¥ ₹ ₿ ©®™.",
]

CJK = [
    "我爱自然语言处理。今天天气很好！",
    "机器学习模型需要大量的数据来训练，例如：文本、图像和音频。",
    "東京は日本の首都です。ひらがな、カタカナ、漢字を混ぜて書きます。",
    "私はコーヒーが好きです☕️。ｶﾀｶﾅ半角もあります。",
    "한국어는 한글로 씁니다. 안녕하세요, 반갑습니다!",
    "繁體中文與简体中文混合：電腦／电脑，資訊／信息。",
    "CJK extension B: 𠀀𠀁𠮷 and compatibility 豈更車 ideographs; 〇〡〢.",
    "全角ＡＢＣ１２３！？　ideographic　space。",
]

OTHER_SCRIPTS = [
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ สวัสดีครับ ขอบคุณมากค่ะ",
    "مرحبا بالعالم! هذه جملة باللغة العربية، مع أرقام ١٢٣٤٥ وتشكيل: كَتَبَ.",
    "שלום עולם, זוהי שורה בעברית עם ניקוד: שָׁלוֹם.",
    "नमस्ते दुनिया! हिन्दी में लिखा गया वाक्य, अंक ०१२३४५६७८९।",
    "Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Γειά σου κόσμε! Ελληνικά: ΟΔΥΣΣΕΥΣ, ὀδυσσεύς, σοφός.",
    "Ελληνικά ΣΙΣΥΦΟΣ σίσυφος — final sigma ς and capital Σ.",
    "ქართული ენა, Հայերեն լեզու, አማርኛ ቋንቋ, ᏣᎳᎩ.",
    "தமிழ் மொழி, తెలుగు భాష, ಕನ್ನಡ, മലയാളം, বাংলা ভাষা, ਪੰਜਾਬੀ.",
    "Mongolian ᠮᠣᠩᠭᠣᠯ\u180eᠪᠢᠴᠢᠭ with vowel separator, Tibetan བོད་ཡིག་.",
]

NUMBERS = [
    "3.14159265358979323846264338327950288419716939937510",
    "1,000,000 vs 1.000.000 vs 1 000 000 vs 10^6 vs 1e6 vs 0x0F4240",
    "Phone: 555-0199, ZIP 90210-1234, IP 192.168.0.1, port :8080",
    "Dates 2023/12/31 31.12.2023 12-31-23, times 23:59:59.999Z",
    "Arabic-Indic ٠١٢٣٤٥٦٧٨٩, Devanagari ०१२३४५६७८९, Thai ๐๑๒๓๔๕๖๗๘๙",
    "Fullwidth １２３４５, superscripts x² y³ z¹⁰, fractions ½ ¾ ⅞, Roman Ⅻ ⅻ, circled ① ⑳",
    "-42 +17 0.0001 -0.5e-10 6.022e23 007 1_000_000 ∞",
]

CODE = [
    "def encode(self, text: str) -> list[int]: return [self.vocab[t] for t in text.split()]",
    "for (int i = 0; i < n; i++) { sum += a[i] * b[i]; }  // dot product",
    "if (x != NULL && x->next) x = x->next->next; /* skip */",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": null, "b": true}}',
    "SELECT id, name FROM users WHERE age >= 21 AND name LIKE '%son' ORDER BY id DESC;",
    "<div class=\"container\"><p>Hello &amp; welcome</p></div>",
    "$ git commit -m 'fix: off-by-one in tokenizer' && git push origin main",
    "x = lambda a, *args, **kw: (a, args, kw)  # λ",
    "regex: ^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}$",
    "printf(\"%s:%d: %5.2f%%\\n\", __FILE__, __LINE__, 99.5);",
    "#include <stdio.h>\tint main(void)\t{\treturn 0;\t}",
]

URLS = [
    "https://www.example.com/path/to/page.html?query=string&lang=en#section-2",
    "http://localhost:8000/api/v1/users/12345/profile",
    "ftp://files.example.org/pub/data_2024-01-01.tar.gz",
    "https://例え.jp/パス?q=検索 and https://xn--r8jz45g.jp/",
    "mailto:someone@example.com?subject=Hello%20World",
    "www.reddit.com/r/MachineLearning/comments/abc123/d_new_tokenizer/",
]

SPECIALS = [
    "[CLS] manually written [SEP] special tokens [MASK] in text [PAD] [UNK]",
    "the [MASK] sat on the mat.[SEP]next",
    "<|endoftext|>A new document begins<|endoftext|>",
    "<s>RoBERTa style</s></s>pair</s> and a <mask> token",
    "fill the <mask> here and there <mask>",
    "text with   <mask>   spaces around and x<mask>y glued",
    "[sep] [Sep] <S> <MASK> (not special: different case)",
]

# Characters that are whitespace, control or format in various ways.
ODD_SPACES = ["\u00a0", "\u1680", "\u2000", "\u2003", "\u2009", "\u200a", "\u202f", "\u205f", "\u3000",
              "\u2028", "\u2029", "\u0085", "\u000b", "\u000c", "\u180e"]
CONTROLS = ["\u0001", "\u0007", "\u001b", "\u007f", "\u0080", "\u009f", "\u200b", "\u200c", "\u200d",
            "\u200e", "\u202e", "\u2060", "\ufeff", "\u00ad", "\ufffd", "\ue000", "\U000f0000", "\r"]


def long_word(rng):
    kind = rng.randrange(6)
    n = rng.randrange(101, 260)
    if kind == 0:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
    if kind == 1:
        return rng.choice("aeiouxyz") * n
    if kind == 2:
        return "".join(rng.choice("éèêëàâäôöûüçñ") for _ in range(n))
    if kind == 3:
        return "".join(rng.choice("0123456789") for _ in range(n))
    if kind == 4:
        return "https://example.com/" + "".join(rng.choice("abcdef0123456789-_/") for _ in range(n))
    return "super" + "califragilisticexpialidocious" * (n // 29 + 1)


def whitespace_run(rng):
    kind = rng.randrange(5)
    n = rng.randrange(2, 40)
    if kind == 0:
        return " " * n
    if kind == 1:
        return "\t" * rng.randrange(1, 6)
    if kind == 2:
        return "".join(rng.choice(" \t") for _ in range(n))
    if kind == 3:
        return "".join(rng.choice(ODD_SPACES + [" "]) for _ in range(rng.randrange(1, 6)))
    return " " * n + "\t" + " " * rng.randrange(0, 5)


def sprinkle(rng, text, chars, k):
    """Inserts k characters from chars at random places of text."""
    s = list(text)
    for _ in range(k):
        s.insert(rng.randrange(len(s) + 1), rng.choice(chars))
    return "".join(s)


POOLS = [ENGLISH, ACCENTED, COMBINING, EMOJI, CJK, OTHER_SCRIPTS, NUMBERS, CODE, URLS, SPECIALS]


def fragment(rng):
    pool = rng.choice(POOLS)
    text = rng.choice(pool)
    # a piece of it, sometimes
    if len(text) > 12 and rng.random() < 0.35:
        a = rng.randrange(len(text) // 2)
        b = rng.randrange(a + 1, len(text) + 1)
        text = text[a:b]
    return text


def line(rng):
    kind = rng.random()
    if kind < 0.04:
        return ""
    if kind < 0.07:
        return whitespace_run(rng)
    if kind < 0.12:
        return long_word(rng) + rng.choice(["", " ", ". ", " and more"]) + rng.choice(["", fragment(rng)])
    if kind < 0.17:
        return sprinkle(rng, fragment(rng), CONTROLS, rng.randrange(1, 4)) + "."
    if kind < 0.22:
        return sprinkle(rng, fragment(rng), ODD_SPACES, rng.randrange(1, 4))
    if kind < 0.27:
        text = fragment(rng)
        return text.upper() if rng.random() < 0.5 else text.title()
    if kind < 0.32:
        # words glued with punctuation and digits
        parts = [fragment(rng).split(" ")[0] for _ in range(rng.randrange(2, 6))]
        return rng.choice(["", "-", "_", "/", ".", "'", "'s", "123"]).join(parts)
    # mixed fragments joined by ordinary or unusual whitespace
    parts = [fragment(rng) for _ in range(rng.randrange(1, 5))]
    out = parts[0]
    for p in parts[1:]:
        out += (whitespace_run(rng) if rng.random() < 0.25 else " ") + p
    if rng.random() < 0.1:
        out = whitespace_run(rng) + out
    if rng.random() < 0.1:
        out = out + whitespace_run(rng)
    return out


# Dense mixes of precomposed letters, Hangul syllables and combining marks of many
# classes (spacing ones too), where NFD reorders marks across characters.
MARK_ALPHABET = list("abcxyzA\u00c9 .") + ["\u00e9", "\u01d6", "\u0344", "\uac00", "\uac01", "\u1e9b", "\u01d5",
                                            "\u0390", "\u0130", "\ufb01", "\u4e2d", "\u0301", "\u0323", "\u0334",
                                            "\u0f71", "\u0f72", "\u0f73", "\u302e", "\U0001d165", "\u0345", "\u05b0",
                                            "\u0308", "\u00a0", "\u200b", "\u00df", "\u03a3"]
N_MARK_LINES = 100


def mark_line(rng):
    return "".join(rng.choice(MARK_ALPHABET) for _ in range(rng.randrange(1, 40)))


def check(text):
    assert "\n" not in text and "\x00" not in text and not text.endswith("\r"), repr(text)
    return text


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    rng = random.Random(SEED)
    lines = []
    # every snippet whole once, then random lines
    for pool in POOLS:
        lines.extend(pool)
    lines.extend(ODD_SPACES)
    lines.extend(c + "x" + c + "y" for c in CONTROLS)
    while len(lines) < N_LINES:
        lines.append(line(rng))
    marks = random.Random(SEED + 1)
    lines.extend(mark_line(marks) for _ in range(N_MARK_LINES))
    with open(os.path.join(outdir, "tokenizer_corpus.txt"), "w", encoding="utf-8", newline="") as f:
        for t in lines:
            f.write(check(t) + "\n")
    pairs = []
    for _ in range(N_PAIRS):
        a, b = line(rng).replace("\t", " "), line(rng)
        if rng.random() < 0.25:  # long pairs, so truncation cuts both
            a = a + " " + " ".join(fragment(rng) for _ in range(rng.randrange(2, 6)))
            b = b + " " + " ".join(fragment(rng) for _ in range(rng.randrange(2, 6)))
        pairs.append(check(a) + "\t" + check(b))
    with open(os.path.join(outdir, "tokenizer_pairs.txt"), "w", encoding="utf-8", newline="") as f:
        for t in pairs:
            f.write(t + "\n")


if __name__ == "__main__":
    main()
