-- Batch mode ('execution.runtime-mode' = 'batch') of join_auction.sql: the same rows, final results once.
SET 'execution.runtime-mode' = 'batch';
-- q20's shape: every bid joined with its auction (a regular join: both
-- sides kept in state), the auctions of one category kept.
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING
) WITH ('connector' = 'filesystem', 'path' = '${BIDS}', 'format' = 'csv');
CREATE TABLE auction (id BIGINT, seller BIGINT, category BIGINT, `dateTime` TIMESTAMP(3)
) WITH ('connector' = 'filesystem', 'path' = '${AUCTIONS}', 'format' = 'csv');
CREATE TABLE sink (auction BIGINT, price BIGINT, seller BIGINT, category BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT b.auction, b.price, a.seller, a.category
FROM bid b JOIN auction a ON b.auction = a.id WHERE a.category = 10;
