use super::*;

fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty: 1.0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        seed: Some(1234),
        top_logprobs: 0,
    }
}

fn log_softmax_ref(xs: &[f32]) -> Vec<f64> {
    let m = xs.iter().cloned().fold(f64::NEG_INFINITY, |a, b| a.max(b as f64));
    let s: f64 = xs.iter().map(|&x| (x as f64 - m).exp()).sum();
    xs.iter().map(|&x| x as f64 - m - s.ln()).collect()
}

/// Histogram of `draws` tokens.
fn histogram(s: &mut Sampler, logits: &[f32], draws: usize) -> Vec<usize> {
    let mut h = vec![0usize; logits.len()];
    for _ in 0..draws {
        h[s.sample(logits, &[]).token as usize] += 1;
    }
    h
}

fn allowed_only(h: &[usize], allowed: &[usize]) {
    for (i, &c) in h.iter().enumerate() {
        if allowed.contains(&i) {
            assert!(c > 0, "allowed id {i} never drawn: {h:?}");
        } else {
            assert_eq!(c, 0, "disallowed id {i} drawn: {h:?}");
        }
    }
}

#[test]
fn greedy_argmax_and_tie_rule() {
    let mut s = Sampler::new(SamplingParams::greedy(), 5);
    assert_eq!(s.sample(&[0.1, 2.0, -1.0, 1.9, 0.0], &[]).token, 1);
    // tie between 1 and 3 -> lowest id
    assert_eq!(s.sample(&[0.1, 2.0, -1.0, 2.0, 0.0], &[]).token, 1);
    assert_eq!(s.sample(&[3.0, 3.0, 3.0], &[]).token, 0);
    // greedy ignores filters entirely (argmax always survives them)
    let mut p = params(0.0, 1, 0.1, 0.9);
    p.seed = None;
    let mut s = Sampler::new(p, 3);
    assert_eq!(s.sample(&[1.0, 5.0, 2.0], &[]).token, 1);
}

#[test]
fn logprob_is_raw_log_softmax() {
    let logits = [1.0f32, 2.5, -0.5, 0.0, 2.0];
    let reference = log_softmax_ref(&logits);
    // greedy
    let mut s = Sampler::new(SamplingParams::greedy(), 5);
    let r = s.sample(&logits, &[]);
    assert_eq!(r.token, 1);
    assert!((r.logprob as f64 - reference[1]).abs() < 1e-6, "{} vs {}", r.logprob, reference[1]);
    // sampled with temperature + filters: still raw logprobs
    let mut s = Sampler::new(params(0.3, 2, 0.9, 0.0), 5);
    for _ in 0..50 {
        let r = s.sample(&logits, &[]);
        let want = reference[r.token as usize];
        assert!((r.logprob as f64 - want).abs() < 1e-6);
    }
    // with penalties: choice changes, logprob stays raw
    let mut p = SamplingParams::greedy();
    p.repetition_penalty = 10.0;
    let mut s = Sampler::new(p, 5);
    let r = s.sample(&logits, &[1]);
    assert_eq!(r.token, 4); // 2.5/10 = 0.25 < 2.0
    assert!((r.logprob as f64 - reference[4]).abs() < 1e-6);
}

#[test]
fn top_logprobs_sorted_desc_ties_by_lower_id() {
    let logits = [0.5f32, 2.0, 2.0, -1.0, 1.0, 2.0];
    let reference = log_softmax_ref(&logits);
    let mut p = SamplingParams::greedy();
    p.top_logprobs = 4;
    let mut s = Sampler::new(p, 6);
    let r = s.sample(&logits, &[]);
    let ids: Vec<u32> = r.top_logprobs.iter().map(|e| e.0).collect();
    assert_eq!(ids, vec![1, 2, 5, 4]);
    for &(id, lp) in &r.top_logprobs {
        assert!((lp as f64 - reference[id as usize]).abs() < 1e-6);
    }
    assert_eq!(r.top_logprobs[0].1, r.logprob);
    // more than vocab -> whole vocab
    let mut p = SamplingParams::greedy();
    p.top_logprobs = 20;
    let mut s = Sampler::new(p, 3);
    let r = s.sample(&[0.0, 1.0, 0.0], &[]);
    assert_eq!(r.top_logprobs.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 0, 2]);
    // sum of probs over full vocab ~ 1
    let total: f64 = r.top_logprobs.iter().map(|e| (e.1 as f64).exp()).sum();
    assert!((total - 1.0).abs() < 1e-6);
}

#[test]
fn top_k_keeps_only_k() {
    let logits = [1.0f32, 3.0, 2.0, 0.5, 2.5];
    let mut s = Sampler::new(params(1.0, 2, 1.0, 0.0), 5);
    allowed_only(&histogram(&mut s, &logits, 200), &[1, 4]);
    let mut s = Sampler::new(params(1.0, 3, 1.0, 0.0), 5);
    allowed_only(&histogram(&mut s, &logits, 200), &[1, 2, 4]);
    // ties at the k boundary go to the lower id
    let mut s = Sampler::new(params(1.0, 2, 1.0, 0.0), 4);
    allowed_only(&histogram(&mut s, &[1.0, 1.0, 1.0, 1.0], 200), &[0, 1]);
    // k = 1 is greedy
    let mut s = Sampler::new(params(5.0, 1, 1.0, 0.0), 5);
    allowed_only(&histogram(&mut s, &logits, 200), &[1]);
    // k >= vocab keeps everything
    let mut s = Sampler::new(params(1.0, 10, 1.0, 0.0), 3);
    allowed_only(&histogram(&mut s, &[0.0, 0.1, -0.1], 200), &[0, 1, 2]);
}

#[test]
fn top_p_boundary() {
    // Equal logits give exactly representable probabilities 0.25 each.
    let flat = [0.0f32; 4];
    // mass 0.5 reached exactly by {0,1} (ties -> lower ids)
    let mut s = Sampler::new(params(1.0, 0, 0.5, 0.0), 4);
    allowed_only(&histogram(&mut s, &flat, 200), &[0, 1]);
    let mut s = Sampler::new(params(1.0, 0, 0.75, 0.0), 4);
    allowed_only(&histogram(&mut s, &flat, 200), &[0, 1, 2]);
    // just above 0.5 needs a third token
    let mut s = Sampler::new(params(1.0, 0, 0.5001, 0.0), 4);
    allowed_only(&histogram(&mut s, &flat, 200), &[0, 1, 2]);

    // probs ~ [0.5, 0.25, 0.125, 0.125] with ids shuffled
    let l = [0.0f32, 2.0f32.ln(), 4.0f32.ln(), 0.0]; // p: .125 .25 .5 .125
    let mut s = Sampler::new(params(1.0, 0, 0.45, 0.0), 4);
    allowed_only(&histogram(&mut s, &l, 200), &[2]);
    let mut s = Sampler::new(params(1.0, 0, 0.74, 0.0), 4);
    allowed_only(&histogram(&mut s, &l, 200), &[1, 2]);
    // 0.8 needs one of the tied 0.125 tokens: the lower id (0)
    let mut s = Sampler::new(params(1.0, 0, 0.8, 0.0), 4);
    allowed_only(&histogram(&mut s, &l, 300), &[0, 1, 2]);
    // tiny top_p still keeps one token
    let mut s = Sampler::new(params(1.0, 0, 1e-6, 0.0), 4);
    allowed_only(&histogram(&mut s, &l, 100), &[2]);
    // top_p after top_k: top_k=2 -> {2,1} renormalised p = 2/3, 1/3;
    // top_p 0.6 keeps only id 2, 0.7 keeps both.
    let mut s = Sampler::new(params(1.0, 2, 0.6, 0.0), 4);
    allowed_only(&histogram(&mut s, &l, 200), &[2]);
    let mut s = Sampler::new(params(1.0, 2, 0.7, 0.0), 4);
    allowed_only(&histogram(&mut s, &l, 200), &[1, 2]);
}

#[test]
fn min_p_boundary() {
    // w = exp(l - lmax): exp(-0.69)=0.5016 (kept), exp(-0.70)=0.4966 (dropped)
    let l = [0.0f32, -0.69, -0.70, -5.0];
    let mut s = Sampler::new(params(1.0, 0, 1.0, 0.5), 4);
    allowed_only(&histogram(&mut s, &l, 300), &[0, 1]);
    // min_p uses post-temperature probabilities: at T=2,
    // exp(-0.35)=0.7047 kept, exp(-2.5)=0.082 dropped.
    let mut s = Sampler::new(params(2.0, 0, 1.0, 0.5), 4);
    allowed_only(&histogram(&mut s, &l, 300), &[0, 1, 2]);
    // min_p = 1 keeps only the (tied) maxima
    let mut s = Sampler::new(params(1.0, 0, 1.0, 1.0), 4);
    allowed_only(&histogram(&mut s, &[1.0, 3.0, 3.0, 2.0], 200), &[1, 2]);
    // combined with top_p: top_p would keep {0} only (p0 ~ 0.4 >= 0.3)
    let mut s = Sampler::new(params(1.0, 0, 0.3, 0.5), 4);
    allowed_only(&histogram(&mut s, &l, 200), &[0]);
    // combined with top_p where min_p is tighter than top_p
    let mut s = Sampler::new(params(1.0, 0, 0.99, 0.5), 4);
    allowed_only(&histogram(&mut s, &l, 300), &[0, 1]);
}

#[test]
fn very_low_temperature_is_greedy() {
    let logits = [1.0f32, 1.1, 0.9, -3.0];
    for t in [1e-3f32, 1e-20, 1e-38] {
        let mut s = Sampler::new(params(t, 0, 1.0, 0.0), 4);
        allowed_only(&histogram(&mut s, &logits, 200), &[1]);
    }
    // high temperature spreads mass over all tokens
    let mut s = Sampler::new(params(100.0, 0, 1.0, 0.0), 4);
    allowed_only(&histogram(&mut s, &logits, 400), &[0, 1, 2, 3]);
}

#[test]
fn repetition_penalty_changes_choice_exactly() {
    let logits = [2.0f32, 1.9, -1.0, -1.05];
    let mut p = SamplingParams::greedy();
    // 2.0 / 1.05 = 1.9048 > 1.9 -> still 0
    p.repetition_penalty = 1.05;
    let mut s = Sampler::new(p.clone(), 4);
    assert_eq!(s.sample(&logits, &[0]).token, 0);
    assert!((s.penalised[0] - 2.0 / 1.05).abs() < 1e-6);
    // 2.0 / 1.06 = 1.8868 < 1.9 -> 1
    p.repetition_penalty = 1.06;
    let mut s = Sampler::new(p.clone(), 4);
    assert_eq!(s.sample(&logits, &[0, 0, 0]).token, 1);
    // applied once per distinct token, not per occurrence
    assert!((s.penalised[0] - 2.0 / 1.06).abs() < 1e-6);
    // negative logits are multiplied: -1.0 * 1.06 = -1.06 < -1.05
    let mut s = Sampler::new(p.clone(), 2);
    assert_eq!(s.sample(&[-1.0, -1.05], &[0]).token, 1);
    assert_eq!(s.penalised, vec![-1.06, -1.05]);
    // tokens outside the vocab in context are ignored
    let mut s = Sampler::new(p, 2);
    assert_eq!(s.sample(&[1.0, 0.5], &[7, 1000]).token, 0);
}

#[test]
fn frequency_and_presence_penalties_on_generated_only() {
    let logits = [1.0f32, 0.5, 0.0];
    let mut p = SamplingParams::greedy();
    p.frequency_penalty = 0.3;
    p.presence_penalty = 0.2;
    let mut s = Sampler::new(p, 3);
    // context is NOT used for frequency/presence
    assert_eq!(s.sample(&logits, &[0, 0, 0, 0]).token, 0);
    s.accept(0);
    // 1.0 - 0.3 - 0.2 = 0.5 ties with id 1 (0.5) -> lowest id 0
    let r = s.sample(&logits, &[]);
    assert!((s.penalised[0] - 0.5).abs() < 1e-6);
    assert_eq!(r.token, 0);
    s.accept(0);
    // 1.0 - 0.6 - 0.2 = 0.2 < 0.5 -> 1
    assert_eq!(s.sample(&logits, &[]).token, 1);
    assert!((s.penalised[0] - 0.2).abs() < 1e-6);
    s.accept(1);
    // 0: 0.2, 1: 0.5 - 0.3 - 0.2 = 0.0, 2: 0.0 -> 0
    assert_eq!(s.sample(&logits, &[]).token, 0);
    assert!((s.penalised[1] - 0.0).abs() < 1e-6);
    assert_eq!(s.penalised[2], 0.0);
    // reset clears counts -> back to raw argmax
    s.reset();
    assert!(s.counts().is_empty());
    assert_eq!(s.sample(&logits, &[]).token, 0);
    assert_eq!(s.counts().get(0), 0);

    // presence is independent of count; frequency scales with it
    let mut p = SamplingParams::greedy();
    p.presence_penalty = 0.45;
    let mut s = Sampler::new(p, 2);
    for _ in 0..5 {
        s.accept(0);
    }
    // 1.0 - 0.45 = 0.55 > 0.5
    assert_eq!(s.sample(&[1.0, 0.5], &[]).token, 0);
    assert!((s.penalised[0] - 0.55).abs() < 1e-6);

    // both repetition and frequency: rep first then subtract
    let mut p = SamplingParams::greedy();
    p.repetition_penalty = 2.0;
    p.frequency_penalty = 0.1;
    let mut s = Sampler::new(p, 2);
    s.accept(0);
    s.accept(0);
    s.sample(&[1.0, -1.0], &[0, 1]);
    // 0: 1.0/2 - 0.2 = 0.3 ; 1: -1.0*2 = -2.0
    assert!((s.penalised[0] - 0.3).abs() < 1e-6);
    assert_eq!(s.penalised[1], -2.0);
}

#[test]
fn seed_determinism() {
    let logits: Vec<f32> = (0..16).map(|i| ((i * 7) % 5) as f32 * 0.3).collect();
    let mut p = params(1.0, 0, 1.0, 0.0);
    p.seed = Some(42);
    let mut a = Sampler::new(p.clone(), 16);
    let mut b = Sampler::new(p.clone(), 16);
    let da: Vec<u32> = (0..50).map(|_| a.sample(&logits, &[]).token).collect();
    let db: Vec<u32> = (0..50).map(|_| b.sample(&logits, &[]).token).collect();
    assert_eq!(da, db);
    p.seed = Some(43);
    let mut c = Sampler::new(p.clone(), 16);
    let dc: Vec<u32> = (0..50).map(|_| c.sample(&logits, &[]).token).collect();
    assert_ne!(da, dc);
    // default params (top_k/top_p/min_p all active) are deterministic too
    let d = SamplingParams { seed: Some(9), ..Default::default() };
    let mut x = Sampler::new(d.clone(), 16);
    let mut y = Sampler::new(d, 16);
    for _ in 0..50 {
        assert_eq!(x.sample(&logits, &[]), y.sample(&logits, &[]));
    }
    // reset does not restart the rng stream
    let mut e = Sampler::new(p.clone(), 16);
    let first: Vec<u32> = (0..20).map(|_| e.sample(&logits, &[]).token).collect();
    e.reset();
    let second: Vec<u32> = (0..20).map(|_| e.sample(&logits, &[]).token).collect();
    assert_ne!(first, second);
    // unseeded samplers work
    let mut u = Sampler::new(SamplingParams { seed: None, ..p }, 16);
    assert!((u.sample(&logits, &[]).token as usize) < 16);
}

#[test]
fn empirical_distribution_matches_softmax() {
    let probs = [0.5f64, 0.3, 0.2];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    let mut s = Sampler::new(params(1.0, 0, 1.0, 0.0), 3);
    let n = 5000;
    let h = histogram(&mut s, &logits, n);
    for (i, &c) in h.iter().enumerate() {
        let f = c as f64 / n as f64;
        // sigma <= sqrt(.25/5000) ~ 0.007
        assert!((f - probs[i]).abs() < 0.025, "id {i}: {f} vs {} ({h:?})", probs[i]);
    }
    // same distribution through the candidate paths (full-vocab min-p,
    // and top-k) — a 4th token that every filter removes.
    let mut l4 = logits.clone();
    l4.push(-100.0);
    for p in [params(1.0, 0, 1.0, 1e-3), params(1.0, 3, 1.0, 0.0), params(1.0, 0, 0.99999, 0.0)] {
        let mut s = Sampler::new(p, 4);
        let h = histogram(&mut s, &l4, n);
        assert_eq!(h[3], 0);
        for (i, &c) in h[..3].iter().enumerate() {
            let f = c as f64 / n as f64;
            assert!((f - probs[i]).abs() < 0.025, "id {i}: {f} vs {} ({h:?})", probs[i]);
        }
    }
    // temperature 2 flattens: p ~ sqrt(p) normalised
    let mut s = Sampler::new(params(2.0, 0, 1.0, 0.0), 3);
    let h = histogram(&mut s, &logits, n);
    let z: f64 = probs.iter().map(|p| p.sqrt()).sum();
    for (i, &c) in h.iter().enumerate() {
        let f = c as f64 / n as f64;
        let want = probs[i].sqrt() / z;
        assert!((f - want).abs() < 0.025, "T=2 id {i}: {f} vs {want}");
    }
}

#[test]
fn nan_and_inf_handling() {
    // NaN treated as -inf
    let mut s = Sampler::new(SamplingParams::greedy(), 3);
    let r = s.sample(&[f32::NAN, 1.0, f32::NAN], &[]);
    assert_eq!(r.token, 1);
    assert!(r.logprob.abs() < 1e-6);
    let mut s = Sampler::new(params(1.0, 0, 0.9, 0.1), 3);
    allowed_only(&histogram(&mut s, &[f32::NAN, 1.0, f32::NEG_INFINITY], 100), &[1]);
    // all -inf / NaN / empty: token 0, logprob -inf, no panic
    for p in [SamplingParams::greedy(), SamplingParams::default()] {
        let mut p = p;
        p.top_logprobs = 2;
        let mut s = Sampler::new(p, 3);
        let r = s.sample(&[f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY], &[0]);
        assert_eq!(r.token, 0);
        assert_eq!(r.logprob, f32::NEG_INFINITY);
        assert_eq!(r.top_logprobs.len(), 2);
        let r = s.sample(&[], &[]);
        assert_eq!(r.token, 0);
        assert_eq!(r.logprob, f32::NEG_INFINITY);
        assert!(r.top_logprobs.is_empty());
    }
    // +inf logit: chosen, finite logprob, no NaN anywhere
    let p = SamplingParams { seed: Some(1), top_logprobs: 3, ..Default::default() };
    let mut s = Sampler::new(p, 3);
    let r = s.sample(&[0.0, f32::INFINITY, 1.0], &[]);
    assert_eq!(r.token, 1);
    assert!(!r.logprob.is_nan());
    assert!(r.top_logprobs.iter().all(|e| !e.1.is_nan()));
}

/// Reference filter: full sort, then top-k, top-p, min-p literally.
fn reference_filter(l: &[f32], t: f32, k: usize, top_p: f32, min_p: f32) -> Vec<u32> {
    let mut c: Vec<(u32, f32)> = l.iter().enumerate().map(|(i, &x)| (i as u32, x)).filter(|c| c.1 > f32::NEG_INFINITY).collect();
    c.sort_by(cmp_desc);
    if k > 0 {
        c.truncate(k);
    }
    let lmax = c[0].1;
    let w: Vec<f64> = c.iter().map(|x| ((x.1 - lmax) / t).exp() as f64).collect();
    let total: f64 = w.iter().sum();
    let mut keep = c.len();
    if top_p < 1.0 {
        let mut cum = 0.0;
        for (i, wi) in w.iter().enumerate() {
            cum += wi;
            if cum >= top_p as f64 * total {
                keep = i + 1;
                break;
            }
        }
    }
    let mut out: Vec<u32> = c[..keep]
        .iter()
        .zip(&w)
        .filter(|(_, &wi)| min_p == 0.0 || wi >= min_p as f64)
        .filter(|(_, &wi)| wi > 0.0)
        .map(|(x, _)| x.0)
        .collect();
    out.sort();
    out
}

/// Ids that survive `select` (all positive-weight ids for `Full`).
fn selected_ids(logits: &[f32], p: &SamplingParams) -> Vec<u32> {
    let mut s = Scratch::default();
    let mut ids: Vec<u32> = match select(logits, p, &mut s) {
        Selection::Empty => vec![],
        Selection::Full(_) => (0..logits.len() as u32).filter(|&i| s.wbuf[i as usize] > 0.0).collect(),
        Selection::Cand(total) => {
            let sum: f64 = s.cand_w.iter().map(|&w| w as f64).sum();
            assert!((sum - total).abs() <= 1e-9 * total);
            assert_eq!(s.cand.len(), s.cand_w.len());
            s.cand.iter().map(|c| c.0).collect()
        }
    };
    ids.sort();
    let before = ids.len();
    ids.dedup();
    assert_eq!(before, ids.len(), "duplicate survivors");
    ids
}

#[test]
fn fast_exp_accuracy() {
    let mut worst = 0.0f64;
    let mut x = -87.0f32;
    while x <= 10.0 {
        let got = fast_exp(x) as f64;
        let want = (x as f64).exp();
        worst = worst.max(((got - want) / want).abs());
        x += 0.000_37;
    }
    assert!(worst < 3e-7, "worst rel err {worst}");
    assert_eq!(fast_exp(0.0), 1.0);
    assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
    assert_eq!(fast_exp(f32::NAN), 0.0);
    assert_eq!(fast_exp(-100.0), 0.0);
}

#[test]
fn filters_match_full_sort_reference_large_vocab() {
    let mut rng = StdRng::seed_from_u64(7);
    let v = 152_064;
    let uniform: Vec<f32> = (0..v).map(|_| rng.random::<f32>() * 20.0 - 10.0).collect();
    // LLM-like: a few strong tokens over a broad low tail, plus -inf holes.
    let peaked: Vec<f32> = (0..v)
        .map(|i| match i % 50_000 {
            7 => 12.0,
            13 => 11.5,
            99 => 10.0,
            _ if i % 997 == 0 => f32::NEG_INFINITY,
            _ => rng.random::<f32>() * 8.0 - 6.0,
        })
        .collect();
    let cases = [
        (1.0, 0, 0.9, 0.0),
        (1.0, 0, 0.5, 0.0),
        (0.7, 0, 0.95, 0.0),
        (1.0, 40, 0.95, 0.05),
        (0.8, 0, 0.95, 0.05),
        (1.0, 0, 1.0, 0.01),
        (2.0, 1000, 0.3, 0.0),
        (5.0, 0, 0.99, 0.0),
        (1.0, 5000, 1.0, 0.0),
        (0.01, 0, 0.9, 0.0),
        (50.0, 0, 0.9, 0.2),
    ];
    for logits in [&uniform, &peaked] {
        for (t, k, tp, m) in cases {
            let p = params(t, k, tp, m);
            let got = selected_ids(logits, &p);
            let want = reference_filter(logits, t, k, tp, m);
            assert_eq!(got.len(), want.len(), "case {:?}", (t, k, tp, m));
            assert_eq!(got, want, "case {:?}", (t, k, tp, m));
        }
    }
}

#[test]
fn small_vocab_filters_match_reference() {
    let mut rng = StdRng::seed_from_u64(11);
    for trial in 0..300 {
        let n = 1 + trial % 40;
        // Coarse values so ties are common.
        let logits: Vec<f32> = (0..n).map(|_| (rng.random::<f32>() * 8.0).floor() * 0.5).collect();
        let t = [0.5f32, 1.0, 3.0][trial % 3];
        let k = [0usize, 1, 3, 10][(trial / 3) % 4];
        let tp = [1.0f32, 0.9, 0.5, 0.1][(trial / 12) % 4];
        let m = [0.0f32, 0.1, 0.6][(trial / 48) % 3];
        let p = params(t, k, tp, m);
        assert_eq!(
            selected_ids(&logits, &p),
            reference_filter(&logits, t, k, tp, m),
            "trial {trial}: {logits:?} {:?}",
            (t, k, tp, m)
        );
    }
}
