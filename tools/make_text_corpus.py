"""A mixed zh/en text corpus for the CosyVoice2 end-to-end benchmark (issue 14): JOBS jobs of 5-400
characters (Chinese, English, and lines mixing both, with numbers, dates, prices and times for the
normaliser) plus CHAPTERS chapters of about 10,000 characters (half Chinese, half English), as
JSON lines `voxbatch enqueue` reads. Deterministic for a seed; the sentences are written here.

  python tools/make_text_corpus.py --jobs 2000 --chapters 10 --seed 7 --voice voice0 > corpus.jsonl
"""
import argparse
import json
import random

ZH = [
    "今天天气很好，我们去公园散步。", "他在2024年1月15日到达北京。", "这本书的价格是¥59.80。",
    "会议将在下午3点30分开始，请准时参加。", "我们的团队有12名工程师和3名设计师。", "这条河全长约6300公里。",
    "春天来了，花园里开满了各种各样的花。", "请拨打电话010-12345678联系客服。", "温度降到了零下5度，大家注意保暖。",
    "她每天早上六点起床，先跑步半小时。", "这家餐厅的招牌菜是红烧肉和清蒸鱼。", "火车晚点了二十分钟，乘客们耐心等待。",
    "增长率达到了百分之十二点五。", "图书馆周一到周五开放，周末休息。", "孩子们在操场上快乐地玩耍。",
    "他用了三年时间完成了这部小说。", "城市的夜景非常美丽，灯火通明。", "请在第35页找到练习题。",
]
EN = [
    "The weather is lovely today, so we walked in the park.", "She arrived in London on March 3, 2024.",
    "The book costs $12.99 at most stores.", "The meeting starts at 10:30 am; please be on time.",
    "Our team has 12 engineers and 3 designers.", "The river is about 6,300 kilometres long.",
    "Spring came early, and the garden was full of flowers.", "Call us at 555-0142 if you have any questions.",
    "The temperature dropped to minus five degrees overnight.", "He wakes up at six and runs for half an hour.",
    "The train was twenty minutes late, but nobody complained.", "Growth reached 12.5% in the third quarter.",
    "The library is open from Monday to Friday.", "Children were playing happily in the yard.",
    "It took him three years to finish the novel.", "Turn to page 35 for the exercises.",
    "In the 1990s, the town had fewer than 5,000 people.", "Dr. Smith will see you at 4 pm.",
]
MIXED = [
    "我们明天用Python写一个demo。", "这个API的响应时间是120毫秒。", "Hello，欢迎来到北京！",
    "他在Google工作了5年。", "The word 你好 means hello.", "请把report发到我的email。",
]


def text_of(rng, length, pool):
    out = ""
    while len(out) < length:
        out += rng.choice(pool) + ("" if pool is ZH else " ")
    out = out.strip()
    if len(out) > length:
        # Cut at the last sentence end within the length, else at the length.
        cut = max(out.rfind(p, 0, length) for p in "。！？.!?")
        out = out[: cut + 1] if cut >= 4 else out[:length]
    return out.strip() or pool[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--chapters", type=int, default=10)
    ap.add_argument("--chapter-chars", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--voice", default="voice0")
    ap.add_argument("--mode", default="cross_lingual")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    lines = []
    for i in range(a.jobs):
        pool = rng.choice([ZH, ZH, EN, EN, MIXED])
        lines.append(text_of(rng, rng.randint(5, 400), pool))
    for c in range(a.chapters):
        pool = ZH if c % 2 == 0 else EN
        lines.append(text_of(rng, a.chapter_chars, pool))
    rng.shuffle(lines)
    for text in lines:
        print(json.dumps({"text": text, "voice": a.voice, "mode": a.mode}, ensure_ascii=False))


if __name__ == "__main__":
    main()
