use super::*;

fn kws(list: &[&str]) -> Vec<Keyword> {
    list.iter().map(|k| Keyword::new(k)).collect()
}

fn router() -> Router {
    Router::new(RouterSettings::default()).unwrap()
}

#[test]
fn keywords_match_whole_words_and_phrases_in_any_script() {
    let q = words("Écris une REQUÊTE sql; the data-base, 数据库 查询 and the command line please");
    for (kw, found) in [
        ("sql", true),
        ("requête", true),
        ("command line", true),
        ("line please", true),
        ("data", true),
        ("base", true),
        ("数据库", true),
        ("数据", true), // CJK splits per ideograph: a run of them is a phrase
        ("comma", false),
        ("and the command", true),
        ("the command please", false),
        ("", false),
    ] {
        assert_eq!(Keyword::new(kw).found_in(&q), found, "{kw}");
    }
    // Inside a longer word does not count (the misspelling rule needs five letters and one
    // edit).
    assert!(!Keyword::new("select").found_in(&words("selected rows")));
    assert!(!Keyword::new("table").found_in(&words("the vegetables")));
    assert!(!Keyword::new("row").found_in(&words("throw it")));
}

#[test]
fn one_edit_misspellings_of_long_words_match() {
    let hit = |q: &str, kw: &str| Keyword::new(kw).found_in(&words(q));
    assert!(hit("query the databse", "database")); // a letter dropped
    assert!(hit("query the dattabase", "database")); // added
    assert!(hit("query the dazabase", "database")); // changed
    assert!(hit("query the datbaase", "database")); // two swapped
    assert!(!hit("query the dtbase", "database")); // two edits
    assert!(!hit("query the xatabase", "database")); // the first letter differs
    assert!(!hit("sel", "sql"), "short words match exactly only");
    assert!(!hit("sqx", "sql"));
    // Plurals and singulars, not other inflections or near words.
    assert!(hit("copy these files", "file") && hit("copy this file", "files"));
    assert!(hit("list the processes", "process") && hit("kill the process", "processes"));
    assert!(!hit("orders were processed", "processes"), "the last letter differs");
    assert!(!hit("you shall not pass", "shell"), "five letters: exact only");
    assert!(!hit("as", "a"));
}

#[test]
fn scores_follow_the_formula_and_choose_best_first() {
    let (sql_kw, sql_ex, sh_kw) = (kws(&["sql", "database", "table"]), kws(&["shell"]), kws(&["shell", "bash", "files"]));
    let none: Vec<Keyword> = Vec::new();
    let c = [
        Candidate { name: "sql", keywords: &sql_kw, exclude_keywords: &sql_ex, priority: 2.0, examples: &[] },
        Candidate { name: "shell", keywords: &sh_kw, exclude_keywords: &none, priority: 1.0, examples: &[] },
        Candidate { name: "plain", keywords: &none, exclude_keywords: &none, priority: 1.0, examples: &[] },
    ];
    let d = router().route("Which table of the database holds the users?", None, &c);
    assert_eq!(d.experts, ["sql"]);
    assert!(!d.generic);
    let names: Vec<&str> = d.scores.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["sql"], "shell has no hit; plain has no keywords or examples");
    assert_eq!((d.scores[0].score, &d.scores[0].keyword_hits[..]), (4.0, &["database".to_string(), "table".to_string()][..]));
    assert!(d.reason.contains("sql") && d.reason.contains("database"), "{}", d.reason);

    // Both domains: both, best first.
    let d = router().route("Write a bash script that dumps the sql database to files", None, &c);
    assert_eq!(d.experts, ["sql", "shell"]);

    // An exclude keyword costs two hits, times priority: 2·(2 − 2) = 0.
    let d = router().route("run the sql database backup from the shell", None, &c);
    assert_eq!(d.scores.iter().find(|s| s.name == "sql").unwrap().score, 0.0);
    assert_eq!(d.experts, ["shell"]);

    // maxExperts and ties (equal score: higher priority first, then the name).
    let r = Router::new(RouterSettings { max_experts: 1, ..Default::default() }).unwrap();
    assert_eq!(r.route("bash and sql please", None, &c).experts, ["sql"]);
    let c2 = [
        Candidate { name: "b", keywords: &sh_kw, exclude_keywords: &none, priority: 1.0, examples: &[] },
        Candidate { name: "a", keywords: &sh_kw, exclude_keywords: &none, priority: 1.0, examples: &[] },
    ];
    assert_eq!(router().route("open a shell now", None, &c2).experts, ["a", "b"]);
}

#[test]
fn generic_queries_stay_on_the_base_unless_keywords_are_strong() {
    let kw = kws(&["sql", "query", "database"]);
    let none: Vec<Keyword> = Vec::new();
    let c = [Candidate { name: "sql", keywords: &kw, exclude_keywords: &none, priority: 1.0, examples: &[] }];
    for q in ["hello, how are you?", "Thanks a lot!", "who are you", "sql", "ok", "Bonjour !"] {
        let d = router().route(q, None, &c);
        assert!(d.generic && d.experts.is_empty(), "{q}: {d:?}");
    }
    let d = router().route("hi! can you write an sql query for me?", None, &c);
    assert!(d.generic && d.experts == ["sql"], "{d:?}");
    assert!(router().route("hello", None, &[]).reason.contains("no experts are loaded"));
}

#[test]
fn similarity_is_the_nearest_centred_example_against_the_generic_references() {
    let none: Vec<Keyword> = Vec::new();
    // A common offset (5, 5, 5) on every vector, as decoder hidden states have: centring
    // removes it. Mean of the five vectors below: (5, 5, 5).
    let ex = vec![vec![6.0f32, 5.0, 5.0], vec![5.0, 6.0, 5.0]];
    let generic = vec![vec![4.0f32, 4.0, 5.0], vec![5.0, 5.0, 6.0], vec![5.0, 5.0, 4.0]];
    let c = [Candidate { name: "x", keywords: &none, exclude_keywords: &none, priority: 1.0, examples: &ex }];
    let q = [5.6f32, 5.8, 5.0]; // centred: (0.6, 0.8, 0)
    let d = router().route("some question about things", Some(Embedded { query: &q, generic: &generic }), &c);
    let s = d.scores[0].similarity.unwrap();
    assert!((s - 0.8).abs() < 1e-6, "{s}");
    let g = d.generic_similarity.unwrap();
    assert!(g.abs() < 1e-6, "orthogonal to (0,0,±1); (-1,-1,0) gives -0.99: {g}");
    assert!((d.scores[0].score - 2.0 * (0.8 - g)).abs() < 1e-6);
    assert_eq!(d.experts, ["x"]);
    assert!(Router::wants_embedding(&c));

    // Nearer to everyday chat than to the examples: not chosen.
    let q = [5.0f32, 5.0, 6.0];
    let d = router().route("some question about things", Some(Embedded { query: &q, generic: &generic }), &c);
    assert!(d.scores[0].score < 0.0 && d.experts.is_empty(), "{d:?}");

    // With a second expert nearer to the query, the first one's similarity counts against it.
    let ex2 = vec![vec![5.6f32, 5.8, 5.1]];
    let c2 = [
        Candidate { name: "x", keywords: &none, exclude_keywords: &none, priority: 1.0, examples: &ex },
        Candidate { name: "y", keywords: &none, exclude_keywords: &none, priority: 1.0, examples: &ex2 },
    ];
    let q = [5.6f32, 5.8, 5.0];
    let d = router().route("some question about things", Some(Embedded { query: &q, generic: &generic }), &c2);
    assert_eq!(d.experts, ["y"], "{d:?}");
    let (y, x) = (&d.scores[0], &d.scores[1]);
    assert!((x.score - 2.0 * (x.similarity.unwrap() - y.similarity.unwrap())).abs() < 1e-9);

    // Vectors that do not fit (another length) are ignored rather than trusted.
    let d = router().route("some question about things", Some(Embedded { query: &[1.0], generic: &generic }), &c);
    assert!(d.scores.is_empty() && d.experts.is_empty(), "{d:?}");
    assert!(d.reason.contains("no expert's keywords match"), "{}", d.reason);
}

#[test]
fn bad_settings_are_refused() {
    let bad = [
        RouterSettings { threshold: f64::NAN, ..Default::default() },
        RouterSettings { max_experts: 0, ..Default::default() },
        RouterSettings { weights: Weights { keywords: f64::INFINITY, similarity: 1.0 }, ..Default::default() },
        RouterSettings { generic_patterns: vec!["(".into()], ..Default::default() },
        RouterSettings { generic_patterns: vec!["a".repeat(5000)], ..Default::default() },
        RouterSettings { generic_patterns: vec![r"\w{1000}{1000}".into()], ..Default::default() },
    ];
    for s in bad {
        assert_eq!(Router::new(s).err().unwrap().code(), "INVALID_ARGUMENT");
    }
}
