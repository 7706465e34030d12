-- q19's shape: the 10 highest bids of every auction (Top-N, rank shown).
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING
) WITH ('connector' = 'filesystem', 'path' = '${BIDS}', 'format' = 'csv');
CREATE TABLE sink (auction BIGINT, price BIGINT, rn BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT auction, price, rn FROM (
  SELECT auction, price, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rn FROM bid
) WHERE rn <= 10;
