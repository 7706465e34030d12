//! The Nexmark event model (after the Nexmark benchmark's generator).
//!
//! Events are numbered 0, 1, 2, ...; the number alone decides the event's
//! kind (epochs of 50: 1 person, 3 auctions, 46 bids), its id and its event
//! time (`base_time + number * 1e6 / first_event_rate` µs), and seeds the
//! random draws for its fields, so any split can generate any slice of the
//! stream and the result is the same however the stream is split.
//!
//! Our random numbers do not replay Java's `java.util.Random`, so values
//! differ from the Java generator's while following the same rules. Bidder
//! ids use the person-id offset once (the Beam original), not twice (the
//! Flink port's quirk).

pub const PERSON_PROPORTION: u64 = 1;
pub const AUCTION_PROPORTION: u64 = 3;
pub const BID_PROPORTION: u64 = 46;
pub const TOTAL_PROPORTION: u64 = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION;

const FIRST_PERSON_ID: u64 = 1000;
const FIRST_AUCTION_ID: u64 = 1000;
const FIRST_CATEGORY_ID: u64 = 10;
const NUM_CATEGORIES: u64 = 5;
const NUM_ACTIVE_PEOPLE: u64 = 1000;
const NUM_IN_FLIGHT_AUCTIONS: u64 = 100;
const PERSON_ID_LEAD: u64 = 10;
const AUCTION_ID_LEAD: u64 = 10;
const HOT_AUCTION_RATIO: u64 = 2;
const HOT_SELLERS_RATIO: u64 = 4;
const HOT_BIDDERS_RATIO: u64 = 4;
const HOT_CHANNELS_RATIO: u64 = 2;
const HOT_BATCH: u64 = 100;
const CHANNELS_NUMBER: u64 = 10_000;
const AVG_PERSON_BYTES: usize = 200;
const AVG_AUCTION_BYTES: usize = 500;
const AVG_BID_BYTES: usize = 100;

const FIRST_NAMES: &[&str] = &[
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];
const LAST_NAMES: &[&str] = &[
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
];
const US_CITIES: &[&str] = &[
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
];
const US_STATES: &[&str] = &["AZ", "CA", "ID", "OR", "WA", "WY"];
const HOT_CHANNELS: &[&str] = &["Google", "Facebook", "Baidu", "Apple"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Person,
    Auction,
    Bid,
}

pub fn kind_of(event_number: u64) -> EventKind {
    let rem = event_number % TOTAL_PROPORTION;
    if rem < PERSON_PROPORTION {
        EventKind::Person
    } else if rem < PERSON_PROPORTION + AUCTION_PROPORTION {
        EventKind::Auction
    } else {
        EventKind::Bid
    }
}

/// Deterministic per-event random numbers (splitmix64).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64, event: u64) -> Self {
        let mut r = Rng(seed ^ event.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        r.next_u64();
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n.max(1))) >> 64) as u64
    }

    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn push_string(&mut self, out: &mut String, len: usize) {
        for _ in 0..len {
            out.push((b'a' + self.below(26) as u8) as char);
        }
    }

    /// Padding that brings an event of `current` bytes to `avg` on average.
    pub fn push_extra(&mut self, out: &mut String, current: usize, avg: usize) {
        if current >= avg {
            return;
        }
        let target = avg - current;
        let delta = (target as f64 * 0.2).round() as u64;
        let len = target as u64 - delta + self.below(2 * delta + 1);
        self.push_string(out, len as usize);
    }
}

fn last_base0_person_id(event_id: u64) -> u64 {
    let epoch = event_id / TOTAL_PROPORTION;
    let offset = PERSON_PROPORTION - 1;
    epoch * PERSON_PROPORTION + offset
}

fn last_base0_auction_id(event_id: u64) -> u64 {
    let mut epoch = event_id / TOTAL_PROPORTION;
    let mut offset = event_id % TOTAL_PROPORTION;
    if offset < PERSON_PROPORTION {
        // Before this epoch's first auction: the last one of the previous.
        epoch = epoch.saturating_sub(1);
        offset = AUCTION_PROPORTION - 1;
    } else if offset >= PERSON_PROPORTION + AUCTION_PROPORTION {
        offset = AUCTION_PROPORTION - 1;
    } else {
        offset -= PERSON_PROPORTION;
    }
    epoch * AUCTION_PROPORTION + offset
}

fn next_base0_person_id(event_id: u64, rng: &mut Rng) -> u64 {
    let num_people = last_base0_person_id(event_id) + 1;
    let active = num_people.min(NUM_ACTIVE_PEOPLE);
    let n = rng.below(active + PERSON_ID_LEAD);
    num_people - active + n
}

fn next_base0_auction_id(event_id: u64, rng: &mut Rng) -> u64 {
    let max = last_base0_auction_id(event_id);
    let min = max.saturating_sub(NUM_IN_FLIGHT_AUCTIONS);
    min + rng.below(max - min + 1 + AUCTION_ID_LEAD)
}

fn next_price(rng: &mut Rng) -> i64 {
    (10f64.powf(rng.unit() * 6.0) * 100.0).round() as i64
}

pub struct Person {
    pub id: i64,
    pub name: String,
    pub email: String,
    pub credit_card: String,
    pub city: &'static str,
    pub state: &'static str,
    pub date_time: i64,
}

pub struct Auction {
    pub id: i64,
    pub item_name: String,
    pub description: String,
    pub initial_bid: i64,
    pub reserve: i64,
    pub date_time: i64,
    pub expires: i64,
    pub seller: i64,
    pub category: i64,
}

pub struct Bid {
    pub auction: i64,
    pub bidder: i64,
    pub price: i64,
    pub channel: u64,
    pub date_time: i64,
}

/// Timing of the event stream.
#[derive(Debug, Clone, Copy)]
pub struct EventTime {
    pub base_time_ms: i64,
    pub first_event_rate: u64,
}

impl EventTime {
    pub fn of(&self, event_number: u64) -> i64 {
        let us = u128::from(event_number) * 1_000_000 / u128::from(self.first_event_rate.max(1));
        self.base_time_ms + (us / 1000) as i64
    }
}

pub fn person(event_number: u64, rng: &mut Rng, time: &EventTime) -> Person {
    let id = last_base0_person_id(event_number) + FIRST_PERSON_ID;
    let name = format!(
        "{} {}",
        FIRST_NAMES[rng.below(FIRST_NAMES.len() as u64) as usize],
        LAST_NAMES[rng.below(LAST_NAMES.len() as u64) as usize]
    );
    let mut email = String::with_capacity(16);
    rng.push_string(&mut email, 7);
    email.push('@');
    rng.push_string(&mut email, 5);
    email.push_str(".com");
    let credit_card = format!(
        "{:04} {:04} {:04} {:04}",
        rng.below(10_000),
        rng.below(10_000),
        rng.below(10_000),
        rng.below(10_000)
    );
    Person {
        id: id as i64,
        name,
        email,
        credit_card,
        city: US_CITIES[rng.below(US_CITIES.len() as u64) as usize],
        state: US_STATES[rng.below(US_STATES.len() as u64) as usize],
        date_time: time.of(event_number),
    }
}

pub fn person_size(p: &Person) -> usize {
    8 + p.name.len() + p.email.len() + p.credit_card.len() + p.city.len() + p.state.len() + 8
}

pub fn auction(event_number: u64, rng: &mut Rng, time: &EventTime) -> Auction {
    let id = last_base0_auction_id(event_number) + FIRST_AUCTION_ID;
    let seller = if rng.below(HOT_SELLERS_RATIO) > 0 {
        (last_base0_person_id(event_number) / HOT_BATCH) * HOT_BATCH
    } else {
        next_base0_person_id(event_number, rng)
    } + FIRST_PERSON_ID;
    let category = FIRST_CATEGORY_ID + rng.below(NUM_CATEGORIES);
    let initial_bid = next_price(rng);
    let reserve = initial_bid + next_price(rng);
    let date_time = time.of(event_number);
    // Auctions run about twice the time it takes to open the next
    // NUM_IN_FLIGHT_AUCTIONS auctions.
    let events_ahead = NUM_IN_FLIGHT_AUCTIONS * TOTAL_PROPORTION / AUCTION_PROPORTION;
    let horizon = time.of(event_number + events_ahead) - date_time;
    let expires = date_time + 1 + rng.below((horizon.max(1) * 2) as u64) as i64;
    let mut item_name = String::with_capacity(20);
    rng.push_string(&mut item_name, 20);
    let mut description = String::with_capacity(100);
    rng.push_string(&mut description, 100);
    Auction {
        id: id as i64,
        item_name,
        description,
        initial_bid,
        reserve,
        date_time,
        expires,
        seller: seller as i64,
        category: category as i64,
    }
}

pub fn auction_size(a: &Auction) -> usize {
    8 + a.item_name.len() + a.description.len() + 8 * 6
}

pub fn bid(event_number: u64, rng: &mut Rng, time: &EventTime) -> Bid {
    let auction = if rng.below(HOT_AUCTION_RATIO) > 0 {
        (last_base0_auction_id(event_number) / HOT_BATCH) * HOT_BATCH
    } else {
        next_base0_auction_id(event_number, rng)
    } + FIRST_AUCTION_ID;
    let bidder = if rng.below(HOT_BIDDERS_RATIO) > 0 {
        (last_base0_person_id(event_number) / HOT_BATCH) * HOT_BATCH + 1
    } else {
        next_base0_person_id(event_number, rng)
    } + FIRST_PERSON_ID;
    let price = next_price(rng);
    // Channel numbers < 4 are the hot channels.
    let channel = if rng.below(HOT_CHANNELS_RATIO) > 0 {
        rng.below(HOT_CHANNELS.len() as u64)
    } else {
        HOT_CHANNELS.len() as u64 + rng.below(CHANNELS_NUMBER)
    };
    Bid {
        auction: auction as i64,
        bidder: bidder as i64,
        price,
        channel,
        date_time: time.of(event_number),
    }
}

pub const BID_FIXED_BYTES: usize = 8 * 4;
pub const AVG_BYTES: (usize, usize, usize) = (AVG_PERSON_BYTES, AVG_AUCTION_BYTES, AVG_BID_BYTES);

/// Channel name and URL of a channel number (fixed per number, like the
/// Java generator's channel cache).
pub fn channel_and_url(channel: u64) -> (String, String) {
    let mut rng = Rng::new(0x5eed, channel);
    let mut url = String::from("https://www.nexmark.com/");
    rng.push_string(&mut url, 5);
    url.push('/');
    rng.push_string(&mut url, 5);
    url.push('/');
    rng.push_string(&mut url, 5);
    url.push_str("/item.htm?query=1");
    if (channel as usize) < HOT_CHANNELS.len() {
        return (HOT_CHANNELS[channel as usize].to_string(), url);
    }
    let n = channel - HOT_CHANNELS.len() as u64;
    if rng.below(10) > 0 {
        url.push_str(&format!("&channel_id={}", (n as u32).reverse_bits() as i32));
    }
    (format!("channel-{n}"), url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proportions_and_ids() {
        let kinds: Vec<EventKind> = (0..50).map(kind_of).collect();
        assert_eq!(kinds.iter().filter(|k| **k == EventKind::Person).count(), 1);
        assert_eq!(kinds.iter().filter(|k| **k == EventKind::Auction).count(), 3);
        assert_eq!(kinds.iter().filter(|k| **k == EventKind::Bid).count(), 46);
        // Person ids count up from 1000, one per epoch.
        let t = EventTime {
            base_time_ms: 0,
            first_event_rate: 10_000,
        };
        assert_eq!(person(0, &mut Rng::new(0, 0), &t).id, 1000);
        assert_eq!(person(50, &mut Rng::new(0, 50), &t).id, 1001);
        assert_eq!(auction(1, &mut Rng::new(0, 1), &t).id, 1000);
        assert_eq!(auction(3, &mut Rng::new(0, 3), &t).id, 1002);
        assert_eq!(auction(51, &mut Rng::new(0, 51), &t).id, 1003);
        // 10 000 events/s of event time: event 10 000 is 1 s later.
        assert_eq!(t.of(10_000), 1000);
    }

    #[test]
    fn bids_refer_to_existing_or_near_future_auctions() {
        let t = EventTime {
            base_time_ms: 0,
            first_event_rate: 10_000,
        };
        for n in (0..100_000u64).filter(|n| kind_of(*n) == EventKind::Bid) {
            let b = bid(n, &mut Rng::new(7, n), &t);
            let last = last_base0_auction_id(n) + FIRST_AUCTION_ID;
            assert!(b.auction as u64 <= last + AUCTION_ID_LEAD, "event {n}");
            assert!(b.price >= 100, "price in cents >= 1 dollar");
        }
    }
}
