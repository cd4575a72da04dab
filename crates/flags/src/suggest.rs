//! "Did you mean `--upstream`?": the flag a mistyped one was most likely meant to be.
//!
//! clap's own hint is a second line under the error, which the binary's one-line error contract
//! drops; this finds the same kind of hint in a form that fits on the one line.

/// The candidate closest to `typed` by edit distance (an insertion, a deletion, a substitution
/// or a swap of two neighbours each count one), when it is close enough to be the one meant: at
/// most two edits, and at most one per three characters of the name without its dashes, so a
/// short name is not "corrected" into an unrelated short one (`--ab` is not offered `--ui`).
/// The first of equally close candidates wins, so the answer follows the order given.
pub fn closest<'a, I>(typed: &str, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    let name = typed.trim_start_matches('-');
    let allowed = (name.chars().count() / 3).clamp(1, 2);
    let mut best: Option<(usize, &str)> = None;
    for candidate in candidates {
        let d = distance(typed, candidate);
        // Zero: the typed name is a candidate, so it was not mistyped (clap refused it for
        // another reason); nothing to suggest.
        if d == 0 || d > allowed {
            continue;
        }
        match best {
            Some((b, _)) if b <= d => {}
            _ => best = Some((d, candidate)),
        }
    }
    best.map(|(_, c)| c)
}

/// The optimal string alignment distance between `a` and `b`, by characters: Levenshtein's
/// edits plus the swap of two adjacent characters, the commonest typo.
pub fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows of the table: two back (for a swap), the last, and the one being filled.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut last: Vec<usize> = (0..=b.len()).collect();
    let mut row: Vec<usize> = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        row[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (last[j] + 1).min(row[j - 1] + 1).min(last[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(before[j - 2] + 1);
            }
            row[j] = d;
        }
        std::mem::swap(&mut before, &mut last);
        std::mem::swap(&mut last, &mut row);
    }
    last[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: &[&str] = &[
        "--upstream",
        "--listen",
        "--metrics-listen",
        "--gpus",
        "--ui",
    ];

    #[test]
    fn edits_and_swaps_count_one_each() {
        assert_eq!(distance("", ""), 0);
        assert_eq!(distance("abc", ""), 3);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("--upsteam", "--upstream"), 1);
        assert_eq!(
            distance("--upstraem", "--upstream"),
            1,
            "a swap is one edit"
        );
        assert_eq!(distance("--gpu", "--gpus"), 1);
        assert_eq!(distance("--lisen", "--listen"), 1);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("--zzzzzz", "--upstream"), 8);
    }

    #[test]
    fn a_close_flag_is_suggested_and_a_distant_one_is_not() {
        assert_eq!(
            closest("--upsteam", FLAGS.iter().copied()),
            Some("--upstream")
        );
        assert_eq!(
            closest("--upstrem", FLAGS.iter().copied()),
            Some("--upstream")
        );
        assert_eq!(
            closest("--uptsreem", FLAGS.iter().copied()),
            Some("--upstream")
        );
        assert_eq!(closest("--gpu", FLAGS.iter().copied()), Some("--gpus"));
        assert_eq!(
            closest("--metrics-lisen", FLAGS.iter().copied()),
            Some("--metrics-listen")
        );
        // Three edits is too many, however long the name.
        assert_eq!(closest("--upxxxeam", FLAGS.iter().copied()), None);
        assert_eq!(closest("--no-such-flag", FLAGS.iter().copied()), None);
        // A short name allows one edit: `--ab` is two from `--ui`, and no typo of it.
        assert_eq!(closest("--ab", FLAGS.iter().copied()), None);
        assert_eq!(closest("--u", FLAGS.iter().copied()), Some("--ui"));
        // A name given exactly was not mistyped.
        assert_eq!(closest("--gpus", FLAGS.iter().copied()), None);
        assert_eq!(closest("--upsteam", []), None);
    }

    #[test]
    fn the_closest_wins_and_ties_go_to_the_first() {
        assert_eq!(
            closest("--listem", ["--listen", "--listed"]),
            Some("--listen")
        );
        assert_eq!(
            closest("--listem", ["--listed", "--listen"]),
            Some("--listed")
        );
        assert_eq!(closest("--gpux", ["--gpuxyz", "--gpus"]), Some("--gpus"));
        // Subcommands are names without dashes.
        assert_eq!(closest("bnech", ["proxy", "bench", "sim"]), Some("bench"));
        assert_eq!(closest("cots", ["cost", "capacity"]), Some("cost"));
    }
}
