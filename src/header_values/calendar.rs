//! The proleptic Gregorian calendar as day counts from 1970-01-01, for the timestamps SigV4 reads (`x-amz-date`)
//! and S3's XML writes: Howard Hinnant's `days_from_civil` and `civil_from_days`, a few lines each, so no date
//! crate for two conversions. Pure integer arithmetic, valid for any year an `i64` day count reaches.

/// Whether `year` has a 29 February.
pub fn is_leap_year(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

/// The days of `month` (1 to 12) in `year`; `None` for another month.
pub fn days_in_month(year: i64, month: i64) -> Option<i64> {
    Some(match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        _ => return None,
    })
}

/// Days since 1970-01-01 of a date (`month` 1 to 12, `day` 1 to its month's days).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date (year, month 1 to 12, day) of a day count from 1970-01-01: the inverse of [`days_from_civil`].
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn known_dates() {
        let known = [((1970, 1, 1), 0), ((2000, 2, 29), 11_016), ((1969, 12, 31), -1), ((2024, 5, 1), 19_844)];
        for ((year, month, day), days) in known.into_iter().chain([((0, 3, 1), -719_468)]) {
            assert_eq!(days_from_civil(year, month, day), days, "{year}-{month}-{day}");
            assert_eq!(civil_from_days(days), (year, month as u32, day as u32), "{days}");
        }
        let february = [1900, 2000, 2023, 2024].map(|year| days_in_month(year, 2));
        assert_eq!(february, [28, 29, 28, 29].map(Some));
        assert_eq!((days_in_month(2024, 0), days_in_month(2024, 13)), (None, None));
    }

    proptest! {
        /// Every date, before 1970 or after, is one day count, and that count reads back as the date.
        #[test]
        fn dates_and_day_counts_convert_both_ways(year in -10_000i64..10_000, month in 1i64..=12, day in 1i64..=31) {
            prop_assume!(day <= days_in_month(year, month).unwrap());
            let days = days_from_civil(year, month, day);
            prop_assert_eq!(civil_from_days(days), (year, month as u32, day as u32));
        }

        /// Consecutive day counts are consecutive dates: the next day of the month, or the first of the next.
        #[test]
        fn day_counts_walk_the_calendar(days in -4_000_000i64..4_000_000) {
            let (y, m, d) = civil_from_days(days);
            let next = civil_from_days(days + 1);
            let last = days_in_month(y, i64::from(m)).unwrap();
            let want = match (i64::from(d) == last, m == 12) {
                (false, _) => (y, m, d + 1),
                (true, false) => (y, m + 1, 1),
                (true, true) => (y + 1, 1, 1),
            };
            prop_assert_eq!(next, want);
        }
    }
}
