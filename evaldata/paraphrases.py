"""The paraphrased-needle task's facts and questions: each fact states a number (``{value}``),
each question asks for it in other words. No content word of a question (nor of the answer cue)
is related to a word of its fact (:mod:`evaldata.words`); tests check every pair.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Paraphrase:
    fact: str
    question: str


PARAPHRASES: tuple[Paraphrase, ...] = (
    Paraphrase("Every visitor to the observatory must sign ledger {value} at the entrance.",
               "Which register do guests of the telescope building put their names in at the "
               "door?"),
    Paraphrase("The lighthouse keeper stored the emergency flares in crate {value}.",
               "In which box did the person tending the coastal beacon put the distress "
               "signals?"),
    Paraphrase("Our bakery files its secret rye recipe under reference {value}.",
               "Under what code is the confidential bread formula of the pastry shop kept?"),
    Paraphrase("The stolen painting was finally recovered in warehouse {value}.",
               "At which storage depot did the missing artwork turn up at last?"),
    Paraphrase("Grandmother hid the family jewels inside safe deposit drawer {value}.",
               "Which bank vault compartment holds the heirloom gems that the old lady "
               "concealed?"),
    Paraphrase("The marathon winner crossed the finish line wearing bib {value}.",
               "What racing tag did the champion of the long-distance run have on?"),
    Paraphrase("Flight attendants must report to gate {value} before boarding begins.",
               "Where should cabin crew members show up ahead of passengers getting on the "
               "plane?"),
    Paraphrase("The village library lends its rare atlas only to members holding card {value}.",
               "Which borrower pass lets someone take home the scarce book of maps from the "
               "town reading room?"),
    Paraphrase("Engineers sealed the leaking reactor valve with gasket model {value}.",
               "Which part type did the technicians use to stop the dripping plant fitting?"),
    Paraphrase("The orchestra rehearses the new symphony in studio {value} on Tuesdays.",
               "In which room does the ensemble practise the fresh composition each week?"),
    Paraphrase("Ships entering the harbour at night must signal on radio channel {value}.",
               "Which frequency should vessels arriving at the port after dark call on?"),
    Paraphrase("The chess champion stored her trophy in locker {value}.",
               "In which cabinet did the top board-game competitor keep her prize cup?"),
    Paraphrase("The zoo's newborn elephant was registered under tag {value}.",
               "What identifier was the baby pachyderm at the animal park entered with?"),
    Paraphrase("The farmer sold his entire apple harvest to buyer {value}.",
               "To which purchaser did the grower hand over all of his orchard crop?"),
    Paraphrase("The astronaut's spacesuit carries serial {value} on its left sleeve.",
               "What manufacturing code is printed on the arm of the orbital traveller's "
               "pressure garment?"),
    Paraphrase("Hikers lost on the glacier should dial emergency line {value}.",
               "Which telephone service must trekkers stranded on the ice field ring?"),
    Paraphrase("The chef keeps the saffron in jar {value} on the top shelf.",
               "Which container holds the costly spice in the cook's kitchen?"),
    Paraphrase("The cyclist repaired her punctured tyre using patch kit {value}.",
               "Which mending set did the bike rider apply to fix the flat wheel?"),
    Paraphrase("The professor graded the final exams in office {value}.",
               "Where did the lecturer mark the end-of-term tests?"),
    Paraphrase("Volunteers planted the oak saplings along trail {value}.",
               "On which path did the helpers put the young trees into the ground?"),
)
