-- One ATC-3 class per prescription row (GAMENet/SafeDrug convention). Owned by the samples stage.
-- ref.ndc_atc3 and ref.drug_name_atc3 keep EVERY candidate ATC-3 of an NDC / drug name (the alternatives stay
-- visible); medtx.codes.mapping picks one per (NDC or drug name, administration route) by, in order:
--   1. adm_r: the candidate whose WHO ATC-5 administration routes include the prescription's route class,
--   2. support: the candidate backed by more distinct ATC-5 codes (ingredient rows) of that NDC / name,
--   3. the alphabetically first ATC-3.
-- core.prescriptions_atc3 records how many candidates there were and which criterion decided.

-- WHO administration routes of a level-5 code, normalised: O, P, R, N, SL, TD, V, Inhal (NULL: no DDD given).
ALTER TABLE ref.atc ADD COLUMN adm_r VARCHAR[];

ALTER TABLE ref.ndc_atc3 ADD COLUMN support INTEGER;      -- distinct ATC-5 (else ATC-4) codes behind this ATC-3
ALTER TABLE ref.ndc_atc3 ADD COLUMN adm_r VARCHAR[];      -- union of those codes' WHO routes

ALTER TABLE ref.drug_name_atc3 ADD COLUMN support INTEGER;
ALTER TABLE ref.drug_name_atc3 ADD COLUMN adm_r VARCHAR[];

ALTER TABLE core.prescriptions_atc3 ADD COLUMN n_candidates INTEGER;  -- ATC-3 classes the row could map to
-- 'only' (one candidate), 'adm_r', 'support' or 'alphabetical': the first rule that separated the winner.
ALTER TABLE core.prescriptions_atc3 ADD COLUMN choice VARCHAR;
