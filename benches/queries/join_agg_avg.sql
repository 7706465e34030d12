-- q4's shape: the highest bid of every auction (a join feeding a GROUP BY),
-- then the average of those per category (an aggregate over updates).
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING
) WITH ('connector' = 'filesystem', 'path' = '${BIDS}', 'format' = 'csv');
CREATE TABLE auction (id BIGINT, seller BIGINT, category BIGINT, `dateTime` TIMESTAMP(3)
) WITH ('connector' = 'filesystem', 'path' = '${AUCTIONS}', 'format' = 'csv');
CREATE TABLE sink (category BIGINT, avg_final BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT category, AVG(final) FROM (
  SELECT a.id, a.category, MAX(b.price) AS final
  FROM auction a JOIN bid b ON a.id = b.auction GROUP BY a.id, a.category
) GROUP BY category;
