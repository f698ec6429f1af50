//! `normalize`'s unit tests.

use super::*;

#[test]
fn prices_and_digit_groups_are_rewritten_before_the_grammars() {
    assert_eq!(digit_groups("共1,234,567人, 12,34", false), "共1234567人, 12,34");
    assert_eq!(digit_groups("1,234 people and 2,000.5 tons", true), "one thousand two hundred and thirty four people and two thousand point five tons");
    assert_eq!(money_zh("¥1,299.00，$12.5万，€3.50，￥5999元"), "1299元，12.5万美元，3.5欧元，5999元");
    assert_eq!(money_en("$1,299.50"), "one thousand two hundred and ninety nine dollars and fifty cents");
    assert_eq!(money_en("$0.99 and $1 and £2.01"), "ninety nine cents and one dollar and two pounds and one penny");
    assert_eq!(money_en("$2.5 million"), "two point five million dollars");
}

#[test]
fn text_is_cut_into_sentences_keeping_every_character() {
    let text = "第一句。第二句！ It costs 3.5 dollars. Dr. Who? Next?\nv2.3 is out";
    let parts = sentences(text);
    assert_eq!(parts.iter().map(|(w, s)| format!("{w}{s}")).collect::<String>(), text);
    let bodies: Vec<&str> = parts.iter().map(|p| p.1).collect();
    assert_eq!(bodies, vec!["第一句。", "第二句！", "It costs 3.5 dollars.", "Dr. Who?", "Next?", "", "v2.3 is out"]);
}

#[test]
fn a_long_sentence_is_cut_between_plain_words_keeping_every_character() {
    let digits = "one eight four four six seven four four oh seven three seven ".repeat(40);
    let sentence = format!("Order {digits}shipped on Jan. 5th, Dr. Who said.");
    let parts = pieces(&sentence);
    assert!(parts.len() > 5, "{} pieces", parts.len());
    assert_eq!(parts.iter().map(|(w, p)| format!("{w}{p}")).collect::<String>(), sentence);
    assert!(parts[..parts.len() - 1].iter().all(|(_, p)| plain_words(p)), "only the last piece has what the grammar reads");
    assert!(parts.last().is_some_and(|(_, p)| p.ends_with("shipped on Jan. 5th, Dr. Who said.")));
    assert_eq!(pieces("Short one."), vec![("", "Short one.")]);
}

#[test]
fn blanks_brackets_and_trailing_commas_as_the_reference_but_english_beside_chinese_keeps_its_blanks() {
    assert_eq!(replace_blank("你 好 a b 世界 c"), "你好 a b 世界 c");
    assert_eq!(replace_blank("我们 on 二零二四年五月一日 at 三pm 见面。 Hi ， 好"), "我们 on 二零二四年五月一日 at 三pm 见面。Hi，好");
    assert_eq!(remove_bracket("（注）【重要】——完"), "注重要 完");
    assert_eq!(trailing_comma().replace("好的，，", "。"), "好的。");
}
