//! The time ranges histories are read over (`?range=` of the evidence and project history
//! endpoints), parsed in one place.

/// A history's range, back from now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Range {
    Hour,
    Day,
    Week,
    Month,
}

impl Range {
    /// What a service's work and fit histories are read over.
    pub const USAGE: [Range; 3] = [Range::Hour, Range::Day, Range::Month];
    /// What a project's history is read over.
    pub const PROJECT: [Range; 3] = [Range::Hour, Range::Day, Range::Week];

    /// `s` as one of `allowed`, or a message naming them (`must be hour, day or month, got
    /// "year"`).
    pub fn parse(s: &str, allowed: &[Range]) -> Result<Range, String> {
        allowed
            .iter()
            .copied()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = allowed.iter().map(|r| r.as_str()).collect();
                let list = match names.split_last() {
                    Some((last, [])) => (*last).to_owned(),
                    Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                    None => String::new(),
                };
                format!("must be {list}, got {s:?}")
            })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Range::Hour => "hour",
            Range::Day => "day",
            Range::Week => "week",
            Range::Month => "month",
        }
    }

    /// Its length in seconds (a month is 30 days).
    pub fn secs(self) -> i64 {
        match self {
            Range::Hour => 3600,
            Range::Day => 86_400,
            Range::Week => 7 * 86_400,
            Range::Month => 30 * 86_400,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_endpoint_takes_its_ranges_and_names_them_when_refused() {
        assert_eq!(Range::parse("day", &Range::USAGE), Ok(Range::Day));
        assert_eq!(Range::parse("week", &Range::PROJECT), Ok(Range::Week));
        assert_eq!(
            Range::parse("week", &Range::USAGE),
            Err("must be hour, day or month, got \"week\"".into())
        );
        assert_eq!(
            Range::parse("", &Range::PROJECT),
            Err("must be hour, day or week, got \"\"".into())
        );
        assert_eq!(Range::Month.secs(), 30 * Range::Day.secs());
        assert_eq!(Range::Week.secs(), 7 * 86_400);
    }
}
